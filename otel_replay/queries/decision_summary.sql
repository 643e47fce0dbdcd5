-- decision_summary: a scan of every decision: per decision type, how many
-- decisions, how many carry a confidence, and their mean confidence.
-- Returns (decision_type, decisions, with_confidence, mean_confidence).
-- Variables: decision_type (NULL for every type).
-- The same figures as grouping the `decisions` view; reads decision_facts
-- (facts_views.sql), which uses compaction's facts files where the Store points it
-- at them.
SELECT
    decision_type,
    count(*)                     AS decisions,
    count(confidence)            AS with_confidence,
    round(avg(confidence), 4)    AS mean_confidence
FROM decision_facts
WHERE getvariable('decision_type') IS NULL OR decision_type = getvariable('decision_type')
GROUP BY decision_type
ORDER BY decision_type NULLS FIRST;
