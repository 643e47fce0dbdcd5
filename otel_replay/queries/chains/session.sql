-- session chain: every decision of one agent session, in time order, with outcomes.
-- Traces only: a session lives inside one agent, so its reasoning is the story.
-- Returns (layer, event_time, record_id, body). Variables: chain_id (the session id, compared as text), chain_limit (default 100).
-- Reads the session's spans once and its decisions' outcomes by the typed column (see chains/trade.sql).
WITH chain_spans AS MATERIALIZED (
    SELECT * FROM spans WHERE session_id = CAST(getvariable('chain_id') AS VARCHAR)
), chain_decisions AS MATERIALIZED (
    SELECT * FROM decisions_in('chain_spans')
), chain_outcome_spans AS (
    SELECT * FROM outcome_spans_for('chain_decisions')
)
SELECT 'trace' AS layer, t.created_at AS event_time, t.record_id, to_json(t) AS body
FROM (
    SELECT d.* REPLACE (CASE WHEN isfinite(d.confidence) THEN d.confidence END AS confidence,
                        CASE WHEN isfinite(d.action_cost) THEN d.action_cost END AS action_cost),
           o.outcome_id, o.outcome_correct, o.note AS outcome_note
    FROM chain_decisions AS d
    LEFT JOIN outcomes_in('chain_outcome_spans') AS o ON o.decision_id = d.record_id
) AS t
ORDER BY t.created_at, t.record_id, t.trace_id, t.span_id
LIMIT coalesce(getvariable('chain_limit'), 100);
