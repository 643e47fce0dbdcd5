-- traces: reasoning traces (decisions) by correlation id and/or session id, in time order,
-- with the outcome the `outcomes` view shows (descriptive; the library replaces it with the
-- verified outcome before acting on it). What DecisionTracer.query_traces reads from a dataset.
-- `body` is strict JSON (a confidence or cost that is not a finite number reads as null).
-- Variables: correlation_id, session_id (compared as text; NULL matches any), trace_limit (default 100).
WITH chosen AS (
    SELECT * FROM decisions AS d
    WHERE (getvariable('correlation_id') IS NULL OR d.correlation_id = CAST(getvariable('correlation_id') AS VARCHAR))
      AND (getvariable('session_id') IS NULL OR d.session_id = CAST(getvariable('session_id') AS VARCHAR))
), chosen_outcomes AS (
    SELECT * FROM outcome_spans_for('chosen')  -- by the typed outcome_decision_id column
)
SELECT 'trace' AS layer, t.created_at AS event_time, t.record_id, to_json(t) AS body
FROM (
    SELECT d.* REPLACE (CASE WHEN isfinite(d.confidence) THEN d.confidence END AS confidence,
                        CASE WHEN isfinite(d.action_cost) THEN d.action_cost END AS action_cost),
           o.outcome_id, o.outcome_correct, o.note AS outcome_note
    FROM chosen AS d
    LEFT JOIN outcomes_in('chosen_outcomes') AS o ON o.decision_id = d.record_id
) AS t
ORDER BY t.created_at, t.record_id, t.trace_id, t.span_id, body  -- copies of one record in a fixed order
LIMIT coalesce(getvariable('trace_limit'), 100);
