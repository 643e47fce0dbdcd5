-- directive chain: issuance -> execution -> decisions -> outcome for one directive id
-- (the correlation id the directive was issued under). Same shape as the trade
-- chain; directives span many sessions, so each layer defaults to 500 rows.
-- Returns (layer, event_time, record_id, body). Variables: chain_id (compared as text), chain_limit.
-- Reads the chain's spans once and its decisions' outcomes by the typed column (see chains/trade.sql).
WITH chain_spans AS MATERIALIZED (
    SELECT * FROM spans WHERE correlation_id = CAST(getvariable('chain_id') AS VARCHAR)
), chain_decisions AS MATERIALIZED (
    SELECT * FROM decisions_in('chain_spans')
), chain_outcome_spans AS (
    SELECT * FROM outcome_spans_for('chain_decisions')
), audit AS (
    SELECT 'audit' AS layer, a.created_at AS event_time, a.entry_id AS record_id, to_json(a) AS body
    FROM audit_entries_in('chain_spans') AS a
    ORDER BY a.created_at, a.entry_id, a.trace_id, a.span_id
    LIMIT coalesce(getvariable('chain_limit'), 500)
), traces AS (
    SELECT 'trace' AS layer, t.created_at AS event_time, t.record_id, to_json(t) AS body
    FROM (
        SELECT d.* REPLACE (CASE WHEN isfinite(d.confidence) THEN d.confidence END AS confidence,
                            CASE WHEN isfinite(d.action_cost) THEN d.action_cost END AS action_cost),
               o.outcome_id, o.outcome_correct, o.note AS outcome_note
        FROM chain_decisions AS d
        LEFT JOIN outcomes_in('chain_outcome_spans') AS o ON o.decision_id = d.record_id
    ) AS t
    ORDER BY t.created_at, t.record_id, t.trace_id, t.span_id
    LIMIT coalesce(getvariable('chain_limit'), 500)
)
SELECT * FROM audit
UNION ALL
SELECT * FROM traces
ORDER BY event_time, layer, record_id, body;
