-- span_source over a compaction batch (the registered Arrow table
-- otel_replay_facts_input), with the typed columns cast as queries/source.sql
-- casts them, so the facts compaction writes are what the views compute.
CREATE OR REPLACE VIEW span_source AS
SELECT * REPLACE (
    TRY_CAST(outcome_decision_id AS VARCHAR) AS outcome_decision_id,
    TRY_CAST(outcome_correct AS BOOLEAN)     AS outcome_correct,
    TRY_CAST(decision_confidence AS DOUBLE)  AS decision_confidence
)
    , CAST(NULL AS VARCHAR) AS filename
FROM otel_replay_facts_input;
