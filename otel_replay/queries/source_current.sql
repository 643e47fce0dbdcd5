-- span_source over files that all have the current schema's columns (storage schema
-- version 2 or later): what queries/source.sql defines, less the empty branch that
-- supplies the version 2 columns when no file has them (binding it costs every query
-- about a millisecond). otel-replay's Store uses this one when every file it reads
-- records version 2 or later, and queries/source.sql otherwise.
CREATE OR REPLACE VIEW span_source AS
SELECT * REPLACE (
    TRY_CAST(outcome_decision_id AS VARCHAR) AS outcome_decision_id,
    TRY_CAST(outcome_correct AS BOOLEAN)     AS outcome_correct,
    TRY_CAST(decision_confidence AS DOUBLE)  AS decision_confidence
)
FROM read_parquet(
    getvariable('otel_replay_files'),
    hive_partitioning = true,
    union_by_name = coalesce(getvariable('otel_replay_union_by_name'), true),
    filename = true
);
