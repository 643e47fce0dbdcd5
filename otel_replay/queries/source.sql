-- span_source: every row of the dataset's Parquet files, plus the hive `date`
-- partition and `filename` (the file each row was read from).
-- Before running this from any DuckDB, point it at the files:
--   SET VARIABLE otel_replay_files = 'traces/spans/**/*.parquet';
-- (a list of paths works too; otel-replay passes the files it validated).
-- Files of different schema versions are read by column name (union_by_name);
-- otel-replay sets otel_replay_union_by_name = false when every footer records
-- one writer schema, so binding a query reads one footer instead of all of them.
CREATE OR REPLACE VIEW span_source AS
SELECT *
FROM read_parquet(
    getvariable('otel_replay_files'),
    hive_partitioning = true,
    union_by_name = coalesce(getvariable('otel_replay_union_by_name'), true),
    filename = true
);
