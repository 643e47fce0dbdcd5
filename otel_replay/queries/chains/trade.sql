-- trade chain: signal -> evaluation -> sizing -> execution -> outcome for one correlation id.
-- Returns (layer, event_time, record_id, body): audit entries ordered by their writers'
-- created_at (undoing arrival-order clock skew) and decisions (with their
-- outcome) in time order; each layer capped at chain_limit rows (default 100). `body` is strict JSON:
-- a confidence or cost stored as NaN or an infinity (a foreign span's) reads as null there.
-- Variables: chain_id (compared as text: a number set there reads as its digits, never as a number that
-- "042" and "42.0" would equal), chain_limit. (The library asks for chain_limit + 1 rows to tell a full layer from a truncated one.)
-- The chain's spans are read once (one scan, filtered by the promoted correlation_id) and
-- unpacked from there; its decisions' outcomes, which may be stored under any correlation id,
-- are found by the typed outcome_decision_id column (a version 1 file's outcome: by its JSON).
-- Copies of one record under other span ids (a replayed or forged row) tie on time and id: they
-- are ordered by trace and span id, so a chain comes back in the same order on every run.
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
    LIMIT coalesce(getvariable('chain_limit'), 100)
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
    LIMIT coalesce(getvariable('chain_limit'), 100)
)
SELECT * FROM audit
UNION ALL
SELECT * FROM traces
ORDER BY event_time, layer, record_id, body;
