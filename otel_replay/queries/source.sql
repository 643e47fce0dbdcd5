-- span_source: every row of the dataset's Parquet files, plus the hive `date`
-- partition and `filename` (the file each row was read from).
-- Before running this from any DuckDB, point it at the files:
--   SET VARIABLE otel_replay_files = 'traces/spans/**/*.parquet';
-- (a list of paths works too; otel-replay passes the files it validated).
-- Files of different schema versions are read by column name (union_by_name);
-- otel-replay sets otel_replay_union_by_name = false when every footer records
-- one writer schema, so binding a query reads one footer instead of all of them.
-- The typed columns of schema version 2 (outcome_decision_id, outcome_correct,
-- decision_confidence) are always there: NULL in rows of version 1 files (the
-- empty branch below supplies them when no file has them), and cast to their
-- type, so a file that stores one as another type cannot change what the
-- others' values read as.
CREATE OR REPLACE VIEW span_source AS
SELECT * REPLACE (
    TRY_CAST(outcome_decision_id AS VARCHAR) AS outcome_decision_id,
    TRY_CAST(outcome_correct AS BOOLEAN)     AS outcome_correct,
    TRY_CAST(decision_confidence AS DOUBLE)  AS decision_confidence
)
FROM (
    SELECT *
    FROM read_parquet(
        getvariable('otel_replay_files'),
        hive_partitioning = true,
        union_by_name = coalesce(getvariable('otel_replay_union_by_name'), true),
        filename = true
    )
    UNION ALL BY NAME
    SELECT CAST(NULL AS VARCHAR) AS outcome_decision_id,
           CAST(NULL AS BOOLEAN) AS outcome_correct,
           CAST(NULL AS DOUBLE)  AS decision_confidence
    WHERE false
);
