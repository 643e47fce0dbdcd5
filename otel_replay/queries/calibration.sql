-- calibration: are confident decisions more often correct? Decisions with a
-- confidence and an outcome, bucketed by confidence in tenths.
-- Returns (bucket, decisions, correct, accuracy, mean_confidence).
-- Variables: decision_type (NULL for every type).
-- The same rows as joining the `decisions` and `outcomes` views, cheaper: it
-- reads decision_facts and first_outcomes (views.sql), which take the
-- compacted partitions' facts files where the Store points them at those
-- and compute the rest from the spans. The join is on the decision id's
-- numeric key (id_hi, id_lo, id_text in views.sql), the same match as
-- o.decision_id = d.record_id.
SELECT
    least(floor(d.confidence * 10) / 10, 0.9)         AS bucket,
    count(*)                                           AS decisions,
    count(*) FILTER (WHERE o.outcome_correct)          AS correct,
    round(avg(CASE WHEN o.outcome_correct THEN 1.0 ELSE 0.0 END), 4) AS accuracy,
    round(avg(d.confidence), 4)                        AS mean_confidence
FROM decision_facts AS d
JOIN first_outcomes AS o
  ON o.id_hi = d.id_hi AND o.id_lo = d.id_lo AND o.id_text IS NOT DISTINCT FROM d.id_text
WHERE d.confidence IS NOT NULL
  AND (getvariable('decision_type') IS NULL OR d.decision_type = getvariable('decision_type'))
GROUP BY bucket
ORDER BY bucket;
