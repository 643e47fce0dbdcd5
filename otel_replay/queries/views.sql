-- The views every consumer shares. Needs `span_source` (queries/source.sql) first.
-- An OTLP client retrying a request whose acknowledgement was lost can store a
-- span twice; `spans` shows every stored row, the record views below count
-- each (trace_id, span_id) once.
--
-- Shape of each record view, so that a lookup by id touches only that id's
-- rows: the inner query filters by kind and unpacks the JSON it needs, and
-- deduplication runs last, over the unpacked columns. A filter on a promoted
-- column (correlation_id, session_id, agent_id, record_id) or on trace_id /
-- span_id written against a view reaches the Parquet scan, so only row groups
-- that can hold the id are read. Outcomes are keyed by their decision id (the
-- typed column outcome_decision_id): `outcomes_of(decision_ids)` applies the
-- ids before ranking.
--
-- Typed columns of schema version 2 (outcome_decision_id, outcome_correct,
-- decision_confidence) are NULL in rows of version 1 files, and in a row whose
-- value was not of the column's type; such a row keeps the value in its JSON,
-- so each view reads coalesce(column, JSON) and shows the same values for both.

-- unambiguous(attributes): false when the attributes JSON repeats a key. JSON
-- readers disagree on which copy wins (DuckDB the first, Python the last), so
-- such a row has no single meaning: the record views below leave it out and
-- `otel-replay verify` names it.
CREATE OR REPLACE MACRO unambiguous(attributes) AS
    attributes IS NULL OR len(json_keys(attributes)) = len(list_distinct(json_keys(attributes)));

-- sealed_here(attributes, trace_id, span_id): false for a verbatim copy of a
-- record stored at another span than the one it was sealed in (its sealed
-- `replay.record.span` names another trace and span). Records written before
-- that attribute existed do not carry it and pass. A missing id reads as '?',
-- as `verify` reads it, so a copy without ids is left out too. The record views
-- below leave such a copy out; `spans` shows it, and `otel-replay verify` names it.
CREATE OR REPLACE MACRO sealed_here(attributes, trace_id, span_id) AS
    (attributes ->> '$."replay.record.span"') IS NULL
    OR (attributes ->> '$."replay.record.span"') = coalesce(trace_id, '?') || '-' || coalesce(span_id, '?');

-- spans: one row per stored span, every column of the storage schema plus `date`
-- and `filename`.
CREATE OR REPLACE VIEW spans AS
SELECT * FROM span_source;

-- decisions: one row per decision span (source 'audit' from audit(), 'tracer'
-- from DecisionTracer.decision), with the record's content unpacked.
-- decisions_in('name'): the same over the rows of the table, view or CTE
-- `name` (a chain filters its spans once and unpacks them through this).
CREATE OR REPLACE MACRO decisions_in(source) AS TABLE
SELECT DISTINCT ON (trace_id, span_id) * FROM (
SELECT
    record_id,
    attributes ->> '$."replay.record.source"'                       AS source,
    decision_type,
    agent_id,
    session_id,
    correlation_id,
    attributes ->> '$."replay.decision.rationale"'                  AS rationale,
    coalesce(decision_confidence,
             TRY_CAST(attributes ->> '$."replay.decision.confidence"' AS DOUBLE)) AS confidence,
    attributes ->> '$."replay.decision.inputs"'                     AS inputs,
    attributes ->> '$."replay.snapshot.state"'                      AS snapshot_state,
    attributes ->> '$."replay.snapshot.version"'                    AS snapshot_version,
    attributes ->> '$."replay.snapshot.captured_at"'                AS snapshot_captured_at,
    attributes ->> '$."replay.action.type"'                         AS action_type,
    attributes ->> '$."replay.action.arguments"'                    AS action_arguments,
    TRY_CAST(attributes ->> '$."replay.action.cost"' AS DOUBLE)     AS action_cost,
    attributes ->> '$."replay.decision.models"'                     AS models,
    attributes ->> '$."replay.record.error"'                        AS error,
    attributes ->> '$."replay.record.hash"'                         AS record_hash,
    start_time                                                      AS created_at,
    end_time,
    duration_ns,
    status_code,
    service_name,
    trace_id,
    span_id,
    parent_span_id
FROM query_table(source)
WHERE replay_kind = 'decision' AND unambiguous(attributes) AND sealed_here(attributes, trace_id, span_id));

CREATE OR REPLACE VIEW decisions AS
SELECT * FROM decisions_in('spans');

-- reads: what each audited decision read (inputs merged across read() calls).
CREATE OR REPLACE VIEW reads AS
SELECT DISTINCT ON (trace_id, span_id) * FROM (
SELECT
    record_id,
    attributes ->> '$."replay.read.inputs"' AS inputs,
    correlation_id, session_id, agent_id,
    start_time, end_time, trace_id, span_id, parent_span_id
FROM spans WHERE replay_kind = 'read' AND unambiguous(attributes));

-- model_calls: model spans from audit() (kind 'model', also the instrumentors'
-- model spans) and any span carrying the OpenTelemetry GenAI conventions
-- (gen_ai.operation.name / gen_ai.request.model), tool executions and agent
-- spans (invoke_agent, create_agent, invoke_workflow) excepted. agent_name is
-- the agent running the call (gen_ai.agent.name, from invoke_agent).
-- The GenAI columns (tokens, finish reasons, tool calls) come from the
-- instrumentors and any other GenAI instrumentation; NULL where not recorded.
CREATE OR REPLACE VIEW model_calls AS
SELECT DISTINCT ON (trace_id, span_id) * FROM (
SELECT
    record_id,
    COALESCE(attributes ->> '$."gen_ai.request.model"', attributes ->> '$."gen_ai.response.model"') AS model,
    attributes ->> '$."gen_ai.operation.name"'        AS operation,
    attributes ->> '$."gen_ai.provider.name"'         AS provider,
    attributes ->> '$."replay.model.decision_basis"'  AS decision_basis,
    attributes ->> '$."replay.model.output"'          AS output,
    correlation_id, session_id, agent_id,
    start_time, end_time, duration_ns, status_code, trace_id, span_id, parent_span_id,
    attributes ->> '$."gen_ai.response.model"'                               AS response_model,
    attributes ->> '$."gen_ai.response.id"'                                  AS response_id,
    TRY_CAST(attributes ->> '$."gen_ai.usage.input_tokens"' AS BIGINT)       AS input_tokens,
    TRY_CAST(attributes ->> '$."gen_ai.usage.output_tokens"' AS BIGINT)      AS output_tokens,
    CAST(attributes -> '$."gen_ai.response.finish_reasons"' AS VARCHAR)     AS finish_reasons,
    attributes ->> '$."replay.model.tool_calls"'                             AS tool_calls,
    COALESCE(TRY_CAST(attributes ->> '$."replay.model.streamed"' AS BOOLEAN), false) AS streamed,
    attributes ->> '$."error.type"'                                          AS error_type,
    attributes ->> '$."gen_ai.input.messages"'                               AS input_messages,
    attributes ->> '$."gen_ai.output.messages"'                              AS output_messages,
    attributes ->> '$."gen_ai.agent.name"'                                   AS agent_name
FROM spans
WHERE (replay_kind = 'model'
       OR attributes ->> '$."gen_ai.operation.name"' IS NOT NULL
       OR attributes ->> '$."gen_ai.request.model"' IS NOT NULL)
  AND replay_kind IS DISTINCT FROM 'tool'
  AND coalesce(attributes ->> '$."gen_ai.operation.name"', '')
      NOT IN ('execute_tool', 'invoke_agent', 'create_agent', 'invoke_workflow')
  AND unambiguous(attributes));

-- acts: the action each audited decision executed (source 'act'), and every
-- tool execution (source 'tool': an `execute_tool {name}` span from the tool
-- decorator, or any span with gen_ai.operation.name = execute_tool). A tool
-- run inside audit() carries the decision's record_id. For a tool row,
-- action_type is the tool name and action_arguments its arguments (recorded
-- only with content capture on).
CREATE OR REPLACE VIEW acts AS
SELECT DISTINCT ON (trace_id, span_id) * FROM (
SELECT
    record_id,
    COALESCE(attributes ->> '$."replay.action.type"', attributes ->> '$."gen_ai.tool.name"') AS action_type,
    COALESCE(attributes ->> '$."replay.action.arguments"',
             attributes ->> '$."gen_ai.tool.call.arguments"')    AS action_arguments,
    TRY_CAST(attributes ->> '$."replay.action.cost"' AS DOUBLE)  AS action_cost,
    correlation_id, session_id, agent_id,
    start_time, end_time, trace_id, span_id, parent_span_id,
    CASE WHEN replay_kind = 'act' THEN 'act' ELSE 'tool' END     AS source,
    attributes ->> '$."gen_ai.tool.name"'                        AS tool_name,
    attributes ->> '$."gen_ai.tool.call.id"'                     AS tool_call_id,
    attributes ->> '$."replay.tool.side_effect"'                 AS side_effect,
    attributes ->> '$."gen_ai.tool.call.result"'                 AS tool_result,
    status_code,
    attributes ->> '$."error.type"'                              AS error_type,
    attributes ->> '$."gen_ai.agent.name"'                       AS agent_name
FROM spans
WHERE (replay_kind IN ('act', 'tool')
       OR (replay_kind IS NULL AND attributes ->> '$."gen_ai.operation.name"' = 'execute_tool'))
  AND unambiguous(attributes));

-- audit_entries: inter-agent messages and system actions. `created_at` is the
-- writer's clock (chains sort on it); `recorded_at` is when the span was made.
-- audit_entries_in('name'): the same over the rows of `name` (see decisions_in).
CREATE OR REPLACE MACRO audit_entries_in(source) AS TABLE
SELECT DISTINCT ON (trace_id, span_id) * FROM (
SELECT
    record_id                                                        AS entry_id,
    attributes ->> '$."replay.audit.event_type"'                    AS event_type,
    attributes ->> '$."replay.audit.source_agent"'                  AS source_agent,
    attributes ->> '$."replay.audit.target_agent"'                  AS target_agent,
    correlation_id,
    session_id,
    TRY_CAST(attributes ->> '$."replay.audit.created_at"' AS TIMESTAMPTZ) AS created_at,
    attributes ->> '$."replay.audit.payload"'                       AS payload,
    start_time                                                       AS recorded_at,
    trace_id,
    span_id
FROM query_table(source)
WHERE replay_kind = 'audit_entry' AND unambiguous(attributes) AND sealed_here(attributes, trace_id, span_id));

CREATE OR REPLACE VIEW audit_entries AS
SELECT * FROM audit_entries_in('spans');

-- outcomes_in('name'): the first (and, by the immutability rule, only)
-- outcome of each decision among the rows of the table, view or CTE `name`
-- (a chain passes just its decisions' outcome spans). The decision id and
-- correctness come from the typed columns (schema version 2); a version 1
-- file's rows have them in the JSON.
CREATE OR REPLACE MACRO outcomes_in(source) AS TABLE
SELECT outcome_id, decision_id, outcome_correct, note, correlation_id, recorded_at, trace_id, span_id
FROM (
    SELECT
        record_id                                                        AS outcome_id,
        coalesce(outcome_decision_id, attributes ->> '$."replay.outcome.decision_id"') AS decision_id,
        coalesce(outcome_correct,
                 TRY_CAST(attributes ->> '$."replay.outcome.correct"' AS BOOLEAN)) AS outcome_correct,
        attributes ->> '$."replay.outcome.note"'                        AS note,
        correlation_id,
        start_time                                                       AS recorded_at,
        trace_id,
        span_id,
        attributes
    FROM query_table(source)
    WHERE replay_kind = 'outcome'
)
WHERE unambiguous(attributes) AND sealed_here(attributes, trace_id, span_id)
QUALIFY row_number() OVER (PARTITION BY decision_id ORDER BY recorded_at, span_id) = 1;

-- outcome_spans_for('name'): every outcome span naming one of the decisions
-- whose record_id is in the table, view or CTE `name`. The typed column
-- outcome_decision_id is matched by a join, so the ids reach the Parquet scan
-- (row-group statistics and bloom filters skip what cannot hold them). An
-- outcome of a version 1 file keeps its decision id in the JSON: the second
-- branch finds it, and reads nothing when the variable
-- otel_replay_legacy_outcomes is false (the Store sets it when every file it
-- reads is version 2 or later; unset, the branch runs).
CREATE OR REPLACE MACRO outcome_spans_for(decisions) AS TABLE
SELECT * FROM spans
WHERE replay_kind = 'outcome'
  AND outcome_decision_id IN (SELECT record_id FROM query_table(decisions))
UNION ALL
SELECT * FROM spans
WHERE coalesce(getvariable('otel_replay_legacy_outcomes'), true)
  AND replay_kind = 'outcome'
  AND outcome_decision_id IS NULL
  AND attributes ->> '$."replay.outcome.decision_id"' IN (SELECT record_id FROM query_table(decisions));

-- outcomes_of(decision_ids): the first outcome of each decision in the list
-- `decision_ids` (NULL: of every decision). The list is applied before the
-- window, so a lookup ranks only its own decisions' outcomes and checks only
-- their JSON for duplicate keys.
CREATE OR REPLACE MACRO outcomes_of(decision_ids) AS TABLE
WITH chosen AS (
    SELECT * FROM spans
    WHERE replay_kind = 'outcome'
      AND (decision_ids IS NULL
           OR outcome_decision_id = ANY(decision_ids)
           OR (outcome_decision_id IS NULL
               AND list_contains(decision_ids, attributes ->> '$."replay.outcome.decision_id"')))
)
SELECT * FROM outcomes_in('chosen');

-- outcomes: the first outcome of every decision that has one.
CREATE OR REPLACE VIEW outcomes AS
SELECT * FROM outcomes_in('spans');

-- gates: what ActionGate did (commit, pre_commit, post_commit) and why.
CREATE OR REPLACE VIEW gates AS
SELECT DISTINCT ON (trace_id, span_id) * FROM (
SELECT
    record_id                                              AS gate_id,
    attributes ->> '$."replay.gate.decision_id"'          AS decision_id,
    attributes ->> '$."replay.gate.stage"'                AS stage,
    attributes ->> '$."replay.gate.fix"'                  AS fix,
    attributes ->> '$."replay.gate.executed"'             AS executed,
    attributes ->> '$."replay.gate.detail"'               AS detail,
    TRY_CAST(attributes ->> '$."replay.gate.justified"' AS BOOLEAN) AS justified,
    attributes ->> '$."replay.gate.reason"'               AS reason,
    attributes ->> '$."replay.gate.receipt"'              AS receipt,
    correlation_id,
    start_time                                             AS recorded_at,
    trace_id,
    span_id
FROM spans WHERE replay_kind = 'gate' AND unambiguous(attributes) AND sealed_here(attributes, trace_id, span_id));

-- ---------------------------------------------------------------------------
-- Decision and outcome facts: what `calibration` and a scan of decisions need,
-- one narrow row per decision or outcome span. Compaction writes them per
-- partition into `_facts-g<gen>-<token>.pq` (otel_replay/storage/facts.py,
-- with these very macros over the rows it compacts); the views below read
-- those files for the compacted files they cover and compute the rest live,
-- so results are the same as the record views' at every moment.
--
-- fact_key(id): a 64-bit key for finding rows that may repeat an id cheaply:
-- the hex value of the id's first 16 characters, NULL when they are not hex.
-- Decisions are keyed by span_id, outcomes by decision_id. Equal ids have
-- equal keys; a key shared by different ids only sends rows to the exact check.
CREATE OR REPLACE MACRO fact_key(id) AS TRY_CAST('0x' || left(id, 16) AS UBIGINT);

-- id_hi(id), id_lo(id), id_text(id): a record id as a join key of two 64-bit
-- numbers. An id of 32 lowercase hex digits (what otel-replay writes) is its
-- own value, so equal numbers mean equal ids; any other id is keyed by its
-- MD5 and kept whole in id_text (NULL for a hex id), which the join compares
-- too. A NULL id gives NULL numbers and matches nothing, as in a join on the id.
CREATE OR REPLACE MACRO fact_hex(id) AS CASE WHEN regexp_full_match(id, '[0-9a-f]{32}') THEN id ELSE md5(id) END;
CREATE OR REPLACE MACRO id_hi(id) AS CAST('0x' || left(fact_hex(id), 16) AS UBIGINT);
CREATE OR REPLACE MACRO id_lo(id) AS CAST('0x' || right(fact_hex(id), 16) AS UBIGINT);
CREATE OR REPLACE MACRO id_text(id) AS CASE WHEN regexp_full_match(id, '[0-9a-f]{32}') THEN NULL ELSE id END;

-- decision_facts_in('name') / outcome_facts_in('name'): the facts of the rows
-- of `name`, computed exactly as decisions_in / outcomes_in compute those
-- columns (the duplicate-key check included), before deduplication.
CREATE OR REPLACE MACRO decision_facts_in(source) AS TABLE
SELECT
    trace_id,
    span_id,
    record_id,
    decision_type,
    coalesce(decision_confidence,
             TRY_CAST(attributes ->> '$."replay.decision.confidence"' AS DOUBLE)) AS confidence
FROM query_table(source)
WHERE replay_kind = 'decision' AND unambiguous(attributes) AND sealed_here(attributes, trace_id, span_id);

CREATE OR REPLACE MACRO outcome_facts_in(source) AS TABLE
SELECT
    trace_id,
    span_id,
    record_id                                                        AS outcome_id,
    coalesce(outcome_decision_id, attributes ->> '$."replay.outcome.decision_id"') AS decision_id,
    coalesce(outcome_correct,
             TRY_CAST(attributes ->> '$."replay.outcome.correct"' AS BOOLEAN)) AS outcome_correct,
    start_time                                                       AS recorded_at
FROM query_table(source)
WHERE replay_kind = 'outcome' AND unambiguous(attributes) AND sealed_here(attributes, trace_id, span_id);

-- span_facts: the stored facts rows. Empty here; the Store points it at the
-- facts files it validated (queries/facts_source.sql), and fact_covered()
-- then lists the span files those facts stand for.
CREATE OR REPLACE VIEW span_facts AS
SELECT CAST(NULL AS VARCHAR) AS kind, CAST(NULL AS UBIGINT) AS key,
       CAST(NULL AS BOOLEAN) AS repeated, CAST(NULL AS BOOLEAN) AS shared,
       CAST(NULL AS VARCHAR) AS trace_id, CAST(NULL AS VARCHAR) AS span_id, CAST(NULL AS VARCHAR) AS record_id,
       CAST(NULL AS UBIGINT) AS id_hi, CAST(NULL AS UBIGINT) AS id_lo, CAST(NULL AS VARCHAR) AS id_text,
       CAST(NULL AS VARCHAR) AS decision_type, CAST(NULL AS DOUBLE) AS confidence,
       CAST(NULL AS VARCHAR) AS decision_id, CAST(NULL AS BOOLEAN) AS outcome_correct,
       CAST(NULL AS TIMESTAMPTZ_NS) AS recorded_at
WHERE false;

CREATE OR REPLACE MACRO fact_covered() AS CAST([] AS VARCHAR[]);
