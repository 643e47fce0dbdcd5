-- trade chain: signal -> evaluation -> sizing -> execution -> outcome for one correlation id.
-- Returns (layer, event_time, record_id, body): audit entries ordered by their writers'
-- created_at (undoing arrival-order clock skew) and decisions (with their
-- outcome) in time order; each layer capped at chain_limit rows (default 100).
-- Variables: chain_id, chain_limit. (The library asks for chain_limit + 1 rows to tell a full layer from a truncated one.)
WITH chain_decisions AS (
    SELECT * FROM decisions AS d WHERE d.correlation_id = getvariable('chain_id')
), audit AS (
    SELECT 'audit' AS layer, a.created_at AS event_time, a.entry_id AS record_id, to_json(a) AS body
    FROM audit_entries AS a
    WHERE a.correlation_id = getvariable('chain_id')
    ORDER BY a.created_at, a.entry_id
    LIMIT coalesce(getvariable('chain_limit'), 100)
), traces AS (
    SELECT 'trace' AS layer, t.created_at AS event_time, t.record_id, to_json(t) AS body
    FROM (
        SELECT d.*, o.outcome_id, o.outcome_correct, o.note AS outcome_note
        FROM chain_decisions AS d
        LEFT JOIN outcomes_of((SELECT coalesce(list(record_id), []) FROM chain_decisions)) AS o
            ON o.decision_id = d.record_id
    ) AS t
    ORDER BY t.created_at, t.record_id
    LIMIT coalesce(getvariable('chain_limit'), 100)
)
SELECT * FROM audit
UNION ALL
SELECT * FROM traces
ORDER BY event_time, layer, record_id;
