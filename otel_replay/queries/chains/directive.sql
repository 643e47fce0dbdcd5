-- directive chain: issuance -> execution -> decisions -> outcome for one directive id
-- (the correlation id the directive was issued under). Same shape as the trade
-- chain; directives span many sessions, so each layer defaults to 500 rows.
-- Returns (layer, event_time, record_id, body). Variables: chain_id, chain_limit.
WITH chain_decisions AS (
    SELECT * FROM decisions AS d WHERE d.correlation_id = getvariable('chain_id')
), audit AS (
    SELECT 'audit' AS layer, a.created_at AS event_time, a.entry_id AS record_id, to_json(a) AS body
    FROM audit_entries AS a
    WHERE a.correlation_id = getvariable('chain_id')
    ORDER BY a.created_at, a.entry_id
    LIMIT coalesce(getvariable('chain_limit'), 500)
), traces AS (
    SELECT 'trace' AS layer, t.created_at AS event_time, t.record_id, to_json(t) AS body
    FROM (
        SELECT d.*, o.outcome_id, o.outcome_correct, o.note AS outcome_note
        FROM chain_decisions AS d
        LEFT JOIN outcomes_of((SELECT coalesce(list(record_id), []) FROM chain_decisions)) AS o
            ON o.decision_id = d.record_id
    ) AS t
    ORDER BY t.created_at, t.record_id
    LIMIT coalesce(getvariable('chain_limit'), 500)
)
SELECT * FROM audit
UNION ALL
SELECT * FROM traces
ORDER BY event_time, layer, record_id;
