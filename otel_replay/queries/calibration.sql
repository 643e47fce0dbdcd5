-- calibration: are confident decisions more often correct? Decisions with a
-- confidence and an outcome, bucketed by confidence in tenths.
-- Returns (bucket, decisions, correct, accuracy, mean_confidence).
-- Variables: decision_type (NULL for every type).
-- The same rows as joining the `decisions` and `outcomes` views, cheaper: it
-- reads decision_facts and first_outcomes (facts_views.sql), which take the
-- compacted partitions' facts files where the Store points them at those
-- and compute the rest from the spans. The join is on the decision id's
-- numeric key (id_hi, id_lo, id_text in views.sql), the same match as
-- o.decision_id = d.record_id.
-- Of the spans no facts file covers, outcomes are unpacked once, and only
-- decisions that may have an outcome (the first half of their id key is an
-- outcome's) are unpacked and checked for duplicate JSON keys.
WITH live_outcomes AS MATERIALIZED (
    SELECT * FROM live_outcome_facts
), outcome_keys AS (
    SELECT id_hi FROM span_facts WHERE kind = 'outcome'
    UNION ALL
    SELECT id_hi FROM live_outcomes
), candidates AS MATERIALIZED (  -- materialized: the key filter runs before the JSON check, not after
    SELECT * FROM spans_without_facts
    WHERE replay_kind = 'decision'
      AND id_hi(record_id) IN (SELECT id_hi FROM outcome_keys)
      AND (getvariable('decision_type') IS NULL OR decision_type = getvariable('decision_type'))
)
SELECT
    least(floor(d.confidence * 10) / 10, 0.9)         AS bucket,
    count(*)                                           AS decisions,
    count(*) FILTER (WHERE o.outcome_correct)          AS correct,
    round(avg(CASE WHEN o.outcome_correct THEN 1.0 ELSE 0.0 END), 4) AS accuracy,
    round(avg(d.confidence), 4)                        AS mean_confidence
FROM decision_facts_over('candidates') AS d
JOIN first_outcomes_over('live_outcomes') AS o
  ON o.id_hi = d.id_hi AND o.id_lo = d.id_lo AND o.id_text IS NOT DISTINCT FROM d.id_text
WHERE d.confidence IS NOT NULL
  AND (getvariable('decision_type') IS NULL OR d.decision_type = getvariable('decision_type'))
GROUP BY bucket
ORDER BY bucket;
