-- calibration: are confident decisions more often correct? Decisions with a
-- confidence and an outcome, bucketed by confidence in tenths.
-- Returns (bucket, decisions, correct, accuracy, mean_confidence).
-- Variables: decision_type (NULL for every type).
-- The same rows as joining the `decisions` and `outcomes` views, cheaper: only
-- decision spans that have an outcome (and the type asked for) are unpacked and
-- checked for duplicate JSON keys (decisions_in), not every decision.
WITH judged AS MATERIALIZED (
    SELECT decision_id, outcome_correct FROM outcomes
), candidates AS MATERIALIZED (
    SELECT * FROM spans
    WHERE replay_kind = 'decision'
      AND record_id IN (SELECT decision_id FROM judged)
      AND (getvariable('decision_type') IS NULL OR decision_type = getvariable('decision_type'))
)
SELECT
    least(floor(d.confidence * 10) / 10, 0.9)         AS bucket,
    count(*)                                           AS decisions,
    count(*) FILTER (WHERE o.outcome_correct)          AS correct,
    round(avg(CASE WHEN o.outcome_correct THEN 1.0 ELSE 0.0 END), 4) AS accuracy,
    round(avg(d.confidence), 4)                        AS mean_confidence
FROM decisions_in('candidates') AS d
JOIN judged AS o ON o.decision_id = d.record_id
WHERE d.confidence IS NOT NULL
GROUP BY bucket
ORDER BY bucket;
