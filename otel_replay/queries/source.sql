-- span_source: every row of the dataset's Parquet files, plus the hive `date`
-- partition and `filename` (the file each row was read from).
-- Before running this from any DuckDB, point it at the files:
--   SET VARIABLE otel_replay_files = 'traces/spans/**/*.parquet';
-- (a list of paths works too; otel-replay passes the files it validated).
-- Files of different schema versions are read by column name (union_by_name);
-- otel-replay sets otel_replay_union_by_name = false when every footer records
-- one writer schema, so binding a query reads one footer instead of all of them.
-- Every column of the span schema is always there, with its type: NULL in rows
-- of files without it (version 1 files have no outcome_decision_id,
-- outcome_correct or decision_confidence; another writer's file may lack more;
-- the empty branch below supplies each column when no file has it), and cast
-- to its type, so a file that stores a column as another type (text, or
-- binary, read as text) cannot change what the others' values read as: its
-- own values that do not cast are NULL.
CREATE OR REPLACE VIEW span_source AS
SELECT * REPLACE (
    TRY_CAST(trace_id AS VARCHAR)                 AS trace_id,
    TRY_CAST(span_id AS VARCHAR)                  AS span_id,
    TRY_CAST(parent_span_id AS VARCHAR)           AS parent_span_id,
    TRY_CAST(trace_state AS VARCHAR)              AS trace_state,
    TRY_CAST(name AS VARCHAR)                     AS name,
    TRY_CAST(kind AS VARCHAR)                     AS kind,
    TRY_CAST(service_name AS VARCHAR)             AS service_name,
    TRY_CAST(scope_name AS VARCHAR)               AS scope_name,
    TRY_CAST(scope_version AS VARCHAR)            AS scope_version,
    TRY_CAST(duration_ns AS BIGINT)               AS duration_ns,
    TRY_CAST(status_code AS VARCHAR)              AS status_code,
    TRY_CAST(status_message AS VARCHAR)           AS status_message,
    TRY_CAST(correlation_id AS VARCHAR)           AS correlation_id,
    TRY_CAST(session_id AS VARCHAR)               AS session_id,
    TRY_CAST(agent_id AS VARCHAR)                 AS agent_id,
    TRY_CAST(record_id AS VARCHAR)                AS record_id,
    TRY_CAST(replay_kind AS VARCHAR)              AS replay_kind,
    TRY_CAST(decision_type AS VARCHAR)            AS decision_type,
    TRY_CAST(outcome_decision_id AS VARCHAR)      AS outcome_decision_id,
    TRY_CAST(outcome_correct AS BOOLEAN)          AS outcome_correct,
    TRY_CAST(decision_confidence AS DOUBLE)       AS decision_confidence,
    TRY_CAST(attributes AS VARCHAR)               AS attributes,
    TRY_CAST(resource_attributes AS VARCHAR)      AS resource_attributes,
    TRY_CAST(dropped_attributes_count AS INTEGER) AS dropped_attributes_count,
    TRY_CAST(dropped_events_count AS INTEGER)     AS dropped_events_count,
    TRY_CAST(dropped_links_count AS INTEGER)      AS dropped_links_count
)
FROM (
    SELECT *
    FROM read_parquet(
        getvariable('otel_replay_files'),
        hive_partitioning = true,
        union_by_name = coalesce(getvariable('otel_replay_union_by_name'), true),
        binary_as_string = true,
        filename = true
    )
    UNION ALL BY NAME
    SELECT CAST(NULL AS VARCHAR) AS trace_id,
           CAST(NULL AS VARCHAR) AS span_id,
           CAST(NULL AS VARCHAR) AS parent_span_id,
           CAST(NULL AS VARCHAR) AS trace_state,
           CAST(NULL AS VARCHAR) AS name,
           CAST(NULL AS VARCHAR) AS kind,
           CAST(NULL AS VARCHAR) AS service_name,
           CAST(NULL AS VARCHAR) AS scope_name,
           CAST(NULL AS VARCHAR) AS scope_version,
           CAST(NULL AS TIMESTAMPTZ_NS) AS start_time,
           CAST(NULL AS TIMESTAMPTZ_NS) AS end_time,
           CAST(NULL AS BIGINT) AS duration_ns,
           CAST(NULL AS VARCHAR) AS status_code,
           CAST(NULL AS VARCHAR) AS status_message,
           CAST(NULL AS VARCHAR) AS correlation_id,
           CAST(NULL AS VARCHAR) AS session_id,
           CAST(NULL AS VARCHAR) AS agent_id,
           CAST(NULL AS VARCHAR) AS record_id,
           CAST(NULL AS VARCHAR) AS replay_kind,
           CAST(NULL AS VARCHAR) AS decision_type,
           CAST(NULL AS VARCHAR) AS outcome_decision_id,
           CAST(NULL AS BOOLEAN) AS outcome_correct,
           CAST(NULL AS DOUBLE) AS decision_confidence,
           CAST(NULL AS VARCHAR) AS attributes,
           CAST(NULL AS VARCHAR) AS resource_attributes,
           CAST(NULL AS STRUCT("time" TIMESTAMPTZ_NS, "name" VARCHAR, attributes VARCHAR)[]) AS events,
           CAST(NULL AS STRUCT(trace_id VARCHAR, span_id VARCHAR, trace_state VARCHAR, attributes VARCHAR)[]) AS links,
           CAST(NULL AS INTEGER) AS dropped_attributes_count,
           CAST(NULL AS INTEGER) AS dropped_events_count,
           CAST(NULL AS INTEGER) AS dropped_links_count
    WHERE false
);
