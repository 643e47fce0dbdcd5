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

-- ---------------------------------------------------------------------------
-- The GenAI conventions map: which span attribute fills which column of
-- model_calls, acts and agents, for every convention in common use. One place:
-- a column reads the first of its attributes that is present, in the order
-- listed (docs/reference/schema.md has the same table).
--   registry      the OpenTelemetry GenAI registry (gen_ai.*), what otel-replay's
--                 instrumentors, the contrib openai-v2 instrumentor and
--                 OpenLLMetry send
--   deprecated    names the registry renamed but instrumentors still send
--                 (gen_ai.system, gen_ai.usage.prompt_tokens, gen_ai.openai.*)
--   OpenLLMetry   gen_ai.is_streaming, gen_ai.usage.total_tokens and
--                 reasoning_tokens, flattened gen_ai.prompt.N.* / gen_ai.completion.N.*,
--                 traceloop.span.kind for its tool, agent and workflow spans
--   OpenInference openinference.span.kind (LLM, EMBEDDING, TOOL, AGENT, CHAIN),
--                 llm.*, flattened llm.output_messages.N.message.tool_calls.M.*,
--                 input.value / output.value, tool.*, agent.name
--   anthropic     the anthropic client's own span (2.x): anthropic.message.stop_reason
-- A value of the wrong type reads as NULL (a token count that is not a whole
-- number >= 0, a stream flag that is not a boolean), and so does content that is
-- not the JSON its convention says.

-- genai_fields(attributes): every attribute the map reads, parsed once, as a
-- struct of texts (a number or an array as its JSON text); NULL when absent.
CREATE OR REPLACE MACRO genai_fields(attributes) AS json_transform(attributes, '{
    "gen_ai.operation.name": "VARCHAR", "llm.request.type": "VARCHAR", "openinference.span.kind": "VARCHAR",
    "gen_ai.request.model": "VARCHAR", "gen_ai.response.model": "VARCHAR",
    "llm.request.model_name": "VARCHAR", "llm.response.model_name": "VARCHAR", "llm.model_name": "VARCHAR",
    "gen_ai.provider.name": "VARCHAR", "gen_ai.system": "VARCHAR", "llm.provider": "VARCHAR", "llm.system": "VARCHAR",
    "gen_ai.response.id": "VARCHAR",
    "gen_ai.usage.input_tokens": "VARCHAR", "gen_ai.usage.prompt_tokens": "VARCHAR", "llm.token_count.prompt": "VARCHAR",
    "gen_ai.usage.output_tokens": "VARCHAR", "gen_ai.usage.completion_tokens": "VARCHAR",
    "llm.token_count.completion": "VARCHAR",
    "gen_ai.usage.total_tokens": "VARCHAR", "llm.usage.total_tokens": "VARCHAR", "llm.token_count.total": "VARCHAR",
    "gen_ai.usage.cache_read.input_tokens": "VARCHAR", "gen_ai.usage.cache_read_input_tokens": "VARCHAR",
    "llm.token_count.prompt_details.cache_read": "VARCHAR",
    "gen_ai.usage.cache_creation.input_tokens": "VARCHAR", "gen_ai.usage.cache_write.input_tokens": "VARCHAR",
    "gen_ai.usage.cache_creation_input_tokens": "VARCHAR", "llm.token_count.prompt_details.cache_write": "VARCHAR",
    "gen_ai.usage.reasoning.output_tokens": "VARCHAR", "gen_ai.usage.reasoning_tokens": "VARCHAR",
    "llm.token_count.completion_details.reasoning": "VARCHAR",
    "gen_ai.response.finish_reasons": "VARCHAR", "llm.finish_reason": "VARCHAR",
    "anthropic.message.stop_reason": "VARCHAR",
    "replay.model.streamed": "VARCHAR", "gen_ai.request.stream": "VARCHAR", "gen_ai.is_streaming": "VARCHAR",
    "llm.is_streaming": "VARCHAR", "llm.invocation_parameters": "VARCHAR",
    "gen_ai.response.time_to_first_chunk": "VARCHAR",
    "openai.response.service_tier": "VARCHAR", "gen_ai.openai.response.service_tier": "VARCHAR",
    "openai.response.system_fingerprint": "VARCHAR", "gen_ai.openai.response.system_fingerprint": "VARCHAR",
    "replay.model.tool_calls": "VARCHAR", "replay.model.decision_basis": "VARCHAR", "replay.model.output": "VARCHAR",
    "gen_ai.input.messages": "VARCHAR", "gen_ai.output.messages": "VARCHAR",
    "input.value": "VARCHAR", "output.value": "VARCHAR", "output.mime_type": "VARCHAR",
    "error.type": "VARCHAR", "gen_ai.agent.name": "VARCHAR", "agent.name": "VARCHAR"
}');

-- genai_count(text): a token count: a whole number from 0 up (5 and 5.0 alike), else NULL.
CREATE OR REPLACE MACRO genai_count(t) AS
    TRY_CAST(CASE WHEN regexp_full_match(t, '[0-9]{1,18}(\.0*)?') THEN t END AS DOUBLE)::BIGINT;

-- genai_flag(text): true / false (a boolean, or the text "true" / "false"), else NULL.
CREATE OR REPLACE MACRO genai_flag(t) AS CASE t WHEN 'true' THEN true WHEN 'false' THEN false END;

-- genai_call(id, name, arguments): one tool call in the `tool_calls` shape,
-- {id, name[, arguments]}, arguments as text (the JSON text of an object).
-- A part with no name keeps its id, with name null.
CREATE OR REPLACE MACRO genai_call(id, name, arguments) AS
    CASE WHEN arguments IS NULL THEN json_object('id', id, 'name', name)
         ELSE json_object('id', id, 'name', name, 'arguments', arguments) END;

-- genai_call_list(calls): a list of genai_call() as a JSON array text, at most
-- 128 calls (the instrumentors' cap); NULL for none.
CREATE OR REPLACE MACRO genai_call_list(calls) AS
    CASE WHEN len(calls) > 0 THEN CAST(to_json(list_slice(calls, 1, 128)) AS VARCHAR) END;

-- genai_message_calls(messages): the tool_call parts of registry-shaped
-- messages ([{role, parts: [{type: "tool_call", id, name, arguments}]}]).
CREATE OR REPLACE MACRO genai_message_calls(messages) AS
    CASE WHEN json_valid(messages) THEN genai_call_list(list_transform(
        list_filter(json_extract(messages, '$[*].parts[*]'), lambda p: p ->> 'type' = 'tool_call'),
        lambda p: genai_call(p ->> 'id', p ->> 'name', p ->> 'arguments'))) END;

-- genai_flat_calls(attributes, pattern): tool calls flattened into one
-- attribute per field (OpenLLMetry's gen_ai.completion.N.tool_calls.M.name,
-- OpenInference's llm.output_messages.N.message.tool_calls.M.tool_call.function.name),
-- as one map of field -> value per call, ordered by N, then M, at most 128.
-- `pattern` captures N, M and the field. (The outer list_transform names the
-- parsed fields once, as a subquery would, without running for every row.)
CREATE OR REPLACE MACRO genai_flat_calls(attributes, pattern) AS list_transform(
    [list_transform(
        list_filter(map_entries(json_transform(attributes, '"MAP(VARCHAR, VARCHAR)"')),
                    lambda e: regexp_matches(e.key, pattern)),
        lambda e: {'at': regexp_extract(e.key, pattern, ['n', 'm', 'f']), 'v': e.value})],
    lambda fields: list_transform(
        list_slice(list_sort(list_distinct(list_transform(fields, lambda x: {
            'n': TRY_CAST(x.at.n AS BIGINT), 'm': TRY_CAST(x.at.m AS BIGINT), 'n_text': x.at.n, 'm_text': x.at.m}))),
            1, 128),
        lambda c: map_from_entries(list_transform(
            list_filter(fields, lambda x: x.at.n = c.n_text AND x.at.m = c.m_text),
            lambda x: {'k': x.at.f, 'v': x.v}))))[1];

-- genai_streamed(g): whether the call streamed: otel-replay's flag, the
-- registry's gen_ai.request.stream, OpenLLMetry's gen_ai.is_streaming (older:
-- llm.is_streaming), OpenInference's "stream" in llm.invocation_parameters.
CREATE OR REPLACE MACRO genai_streamed(g) AS coalesce(
    genai_flag(coalesce(g."replay.model.streamed", g."gen_ai.request.stream", g."gen_ai.is_streaming",
                        g."llm.is_streaming")),
    CASE WHEN json_valid(g."llm.invocation_parameters")
         THEN genai_flag(json_extract_string(g."llm.invocation_parameters", '$.stream')) END);

-- genai_tool_calls(attributes, g): the tool calls a model call asked for, in
-- the `tool_calls` shape: otel-replay's replay.model.tool_calls, the tool_call
-- parts of gen_ai.output.messages (registry), OpenLLMetry's flattened
-- gen_ai.completion.N.tool_calls.M.*, OpenInference's flattened
-- llm.output_messages.N.message.tool_calls.M.tool_call.*.
CREATE OR REPLACE MACRO genai_tool_calls(attributes, g) AS coalesce(
    g."replay.model.tool_calls",
    genai_message_calls(g."gen_ai.output.messages"),
    CASE WHEN contains(attributes, '"gen_ai.completion.') OR contains(attributes, '"llm.output_messages.')
         THEN genai_call_list(list_transform(genai_flat_calls(attributes,
             '^(?:gen_ai\.completion|llm\.output_messages)\.(\d+)\.(?:message\.)?tool_calls\.(\d+)\.(?:tool_call\.)?(id|name|arguments|function\.name|function\.arguments)$'),
             lambda c: genai_call(c['id'], coalesce(c['name'], c['function.name']),
                                  coalesce(c['arguments'], c['function.arguments'])))) END);

-- genai_model_span(attributes, replay_kind): whether a span is a model call:
-- otel-replay's model spans, any span with gen_ai.operation.name or
-- gen_ai.request.model (registry, OpenLLMetry), OpenInference LLM and EMBEDDING
-- spans; tool executions and agent and workflow spans are not. The text is
-- searched before it is parsed: most spans carry none of these keys.
CREATE OR REPLACE MACRO genai_model_span(attributes, replay_kind) AS
    (replay_kind = 'model'
     OR (contains(attributes, '"gen_ai.')
         AND ((attributes ->> '$."gen_ai.operation.name"') IS NOT NULL
              OR (attributes ->> '$."gen_ai.request.model"') IS NOT NULL))
     OR (contains(attributes, '"openinference.span.kind"')
         AND (attributes ->> '$."openinference.span.kind"') IN ('LLM', 'EMBEDDING')))
    AND replay_kind IS DISTINCT FROM 'tool'
    AND NOT (contains(attributes, '"gen_ai.operation.name"')
             AND coalesce(attributes ->> '$."gen_ai.operation.name"', '')
                 IN ('execute_tool', 'invoke_agent', 'create_agent', 'invoke_workflow'))
    AND NOT (contains(attributes, '"openinference.span.kind"')
             AND coalesce(attributes ->> '$."openinference.span.kind"', 'LLM') NOT IN ('LLM', 'EMBEDDING'));

-- model_calls: one row per model call: otel-replay's model spans (audit()'s
-- d.model(), the instrumentors') and any other instrumentation's, read through
-- the map above. agent_name is the agent running the call, where the span
-- names it (gen_ai.agent.name, OpenInference agent.name); `agents` lists the
-- agent spans themselves. NULL where a convention does not record a column.
-- One call, one row: a span that repeats an otel-replay model span of the same
-- trace is left out (anthropic 2.x's own `anthropic.messages.create` span under
-- ours; a peer instrumentor's or a framework's span around or under ours): one
-- with the same response id at any depth (a span that is not stored, such as
-- a third instrumentation's exported elsewhere, may sit between them), or one
-- with no response id that is the parent or child of ours. Ours carries the
-- decision's record id and the tool calls.
CREATE OR REPLACE VIEW model_calls AS
SELECT m.* EXCLUDE (not_ours) FROM (
SELECT DISTINCT ON (trace_id, span_id) * FROM (
SELECT
    record_id,
    coalesce(g."gen_ai.request.model", g."gen_ai.response.model",
             g."llm.request.model_name", g."llm.model_name", g."llm.response.model_name") AS model,
    coalesce(g."gen_ai.operation.name", g."llm.request.type",
             CASE g."openinference.span.kind" WHEN 'LLM' THEN 'chat' WHEN 'EMBEDDING' THEN 'embeddings' END) AS operation,
    coalesce(g."gen_ai.provider.name", g."gen_ai.system", g."llm.provider", g."llm.system") AS provider,
    g."replay.model.decision_basis"                                          AS decision_basis,
    g."replay.model.output"                                                  AS output,
    correlation_id, session_id, agent_id,
    start_time, end_time, duration_ns, status_code, trace_id, span_id, parent_span_id,
    coalesce(g."gen_ai.response.model", g."llm.response.model_name",
             CASE WHEN g."openinference.span.kind" IS NOT NULL THEN g."llm.model_name" END) AS response_model,
    coalesce(g."gen_ai.response.id",
             CASE WHEN g."openinference.span.kind" IS NOT NULL AND json_valid(g."output.value")
                  THEN json_extract_string(g."output.value", '$.id') END) AS response_id,
    genai_count(coalesce(g."gen_ai.usage.input_tokens",
                         g."gen_ai.usage.prompt_tokens",
                         g."llm.token_count.prompt"))
                                                            AS input_tokens,
    genai_count(coalesce(g."gen_ai.usage.output_tokens",
                         g."gen_ai.usage.completion_tokens",
                         g."llm.token_count.completion"))
                                                            AS output_tokens,
    coalesce(CASE WHEN json_type(CASE WHEN json_valid(g."gen_ai.response.finish_reasons")
                                     THEN g."gen_ai.response.finish_reasons" END) = 'ARRAY'
                  THEN g."gen_ai.response.finish_reasons" END,
             CASE WHEN g."llm.finish_reason" IS NOT NULL
                  THEN CAST(to_json([g."llm.finish_reason"]) AS VARCHAR) END,
             CASE WHEN g."anthropic.message.stop_reason" IS NOT NULL
                  THEN CAST(to_json([g."anthropic.message.stop_reason"]) AS VARCHAR) END) AS finish_reasons,
    genai_tool_calls(attributes, g)                                          AS tool_calls,
    coalesce(genai_streamed(g), false)                                       AS streamed,
    g."error.type"                                                           AS error_type,
    coalesce(g."gen_ai.input.messages",
             CASE WHEN g."openinference.span.kind" IS NOT NULL THEN g."input.value" END)  AS input_messages,
    coalesce(g."gen_ai.output.messages",
             CASE WHEN g."openinference.span.kind" IS NOT NULL THEN g."output.value" END) AS output_messages,
    coalesce(g."gen_ai.agent.name", g."agent.name")                         AS agent_name,
    genai_count(coalesce(g."gen_ai.usage.total_tokens",
                         g."llm.usage.total_tokens",
                         g."llm.token_count.total"))
                                                            AS total_tokens,
    genai_count(coalesce(g."gen_ai.usage.cache_read.input_tokens",
                         g."gen_ai.usage.cache_read_input_tokens",
                         g."llm.token_count.prompt_details.cache_read"))
                                                            AS cache_read_input_tokens,
    genai_count(coalesce(g."gen_ai.usage.cache_creation.input_tokens",
                         g."gen_ai.usage.cache_write.input_tokens",
                         g."gen_ai.usage.cache_creation_input_tokens",
                         g."llm.token_count.prompt_details.cache_write"))
                                                            AS cache_creation_input_tokens,
    genai_count(coalesce(g."gen_ai.usage.reasoning.output_tokens",
                         g."gen_ai.usage.reasoning_tokens",
                         g."llm.token_count.completion_details.reasoning"))
                                                            AS reasoning_tokens,
    TRY_CAST(g."gen_ai.response.time_to_first_chunk" AS DOUBLE)             AS time_to_first_chunk,
    coalesce(g."openai.response.service_tier", g."gen_ai.openai.response.service_tier") AS service_tier,
    coalesce(g."openai.response.system_fingerprint", g."gen_ai.openai.response.system_fingerprint") AS system_fingerprint,
    replay_kind IS DISTINCT FROM 'model'                                     AS not_ours
FROM (SELECT *, genai_fields(attributes) AS g FROM spans
      WHERE genai_model_span(attributes, replay_kind) AND unambiguous(attributes))))
AS m
LEFT JOIN (
    SELECT trace_id AS o_trace, span_id AS o_span, parent_span_id AS o_parent,
           attributes ->> '$."gen_ai.response.id"' AS o_response
    FROM spans WHERE replay_kind = 'model'
) AS o
  ON m.not_ours AND o.o_trace = m.trace_id
 AND (o.o_response = m.response_id
      OR (m.response_id IS NULL AND (o.o_span = m.parent_span_id OR o.o_parent = m.span_id)))
WHERE o.o_trace IS NULL;

-- genai_tool_fields(attributes): the attributes acts and agents read, parsed once.
CREATE OR REPLACE MACRO genai_tool_fields(attributes) AS json_transform(attributes, '{
    "replay.action.type": "VARCHAR", "replay.action.arguments": "VARCHAR", "replay.action.cost": "VARCHAR",
    "gen_ai.operation.name": "VARCHAR", "openinference.span.kind": "VARCHAR", "traceloop.span.kind": "VARCHAR",
    "gen_ai.tool.name": "VARCHAR", "tool.name": "VARCHAR", "traceloop.entity.name": "VARCHAR",
    "gen_ai.tool.call.arguments": "VARCHAR", "input.value": "VARCHAR", "traceloop.entity.input": "VARCHAR",
    "gen_ai.tool.call.id": "VARCHAR", "tool.id": "VARCHAR", "tool_call.id": "VARCHAR",
    "gen_ai.tool.call.result": "VARCHAR", "output.value": "VARCHAR", "traceloop.entity.output": "VARCHAR",
    "replay.tool.side_effect": "VARCHAR", "error.type": "VARCHAR",
    "gen_ai.agent.name": "VARCHAR", "agent.name": "VARCHAR", "gen_ai.agent.id": "VARCHAR",
    "gen_ai.agent.description": "VARCHAR", "gen_ai.workflow.name": "VARCHAR"
}');

-- genai_kind_is(attributes, key, kinds): the span's `key` attribute is one of
-- `kinds` (the text is searched for the key before it is parsed).
CREATE OR REPLACE MACRO genai_kind_is(attributes, key, kinds) AS
    contains(attributes, '"' || key || '"') AND list_contains(kinds, json_extract_string(attributes, '$."' || key || '"'));

-- acts: the action each audited decision executed (source 'act'), and every
-- tool execution (source 'tool'): otel-replay's `execute_tool {name}` spans
-- from the tool decorator, any span with gen_ai.operation.name = execute_tool,
-- OpenInference TOOL spans and OpenLLMetry tool spans (traceloop.span.kind =
-- tool). A tool run inside audit() carries the decision's record_id. For a
-- tool row, action_type is the tool name and action_arguments its arguments
-- (recorded only with content capture on); tool_call_id is the model's call
-- id (gen_ai.tool.call.id, OpenInference tool.id), the key to the model call
-- that asked for it (`model_calls.tool_calls`). One tool run, one row: a tool
-- span that repeats an otel-replay tool span of the same trace is left out (a
-- framework's own `execute_tool` span around ours, such as pydantic-ai's): one
-- with the same call id, or one with no call id that is the parent or child of
-- ours. Ours carries the decision's record id.
CREATE OR REPLACE VIEW acts AS
SELECT a.* EXCLUDE (not_ours) FROM (
SELECT DISTINCT ON (trace_id, span_id) * FROM (
SELECT
    record_id,
    coalesce(g."replay.action.type", g."gen_ai.tool.name", g."tool.name", g."traceloop.entity.name") AS action_type,
    coalesce(g."replay.action.arguments", g."gen_ai.tool.call.arguments",
             CASE WHEN g."openinference.span.kind" = 'TOOL' THEN g."input.value" END,
             g."traceloop.entity.input")                                     AS action_arguments,
    TRY_CAST(g."replay.action.cost" AS DOUBLE)                               AS action_cost,
    correlation_id, session_id, agent_id,
    start_time, end_time, trace_id, span_id, parent_span_id,
    CASE WHEN replay_kind = 'act' THEN 'act' ELSE 'tool' END                 AS source,
    coalesce(g."gen_ai.tool.name", g."tool.name", g."traceloop.entity.name") AS tool_name,
    coalesce(g."gen_ai.tool.call.id", g."tool.id", g."tool_call.id")        AS tool_call_id,
    g."replay.tool.side_effect"                                              AS side_effect,
    coalesce(g."gen_ai.tool.call.result",
             CASE WHEN g."openinference.span.kind" = 'TOOL' THEN g."output.value" END,
             g."traceloop.entity.output")                                    AS tool_result,
    status_code,
    g."error.type"                                                           AS error_type,
    coalesce(g."gen_ai.agent.name", g."agent.name")                         AS agent_name,
    replay_kind IS NULL                                                      AS not_ours
FROM (SELECT *, genai_tool_fields(attributes) AS g FROM spans
      WHERE (replay_kind IN ('act', 'tool')
             OR (replay_kind IS NULL
                 AND (genai_kind_is(attributes, 'gen_ai.operation.name', ['execute_tool'])
                      OR genai_kind_is(attributes, 'openinference.span.kind', ['TOOL'])
                      OR genai_kind_is(attributes, 'traceloop.span.kind', ['tool']))))
        AND unambiguous(attributes))))
AS a
LEFT JOIN (
    SELECT trace_id AS o_trace, span_id AS o_span, parent_span_id AS o_parent,
           attributes ->> '$."gen_ai.tool.call.id"' AS o_call
    FROM spans WHERE replay_kind = 'tool'
) AS o
  ON a.not_ours AND o.o_trace = a.trace_id
 AND (o.o_call = a.tool_call_id
      OR (a.tool_call_id IS NULL AND (o.o_span = a.parent_span_id OR o.o_parent = a.span_id)))
WHERE o.o_trace IS NULL;

-- agents: one row per agent or workflow span: the registry's invoke_agent,
-- create_agent and invoke_workflow spans (otel-replay's invoke_agent() among
-- them), OpenInference AGENT and CHAIN spans, OpenLLMetry agent and workflow
-- spans (traceloop.span.kind). operation is the registry's name for what the
-- span did; agent_name the agent's name (gen_ai.agent.name, OpenInference
-- agent.name, OpenLLMetry traceloop.entity.name, else an agent span's own name);
-- genai_agent_id the agent's gen_ai.agent.id. The model calls and tools an
-- agent ran are the spans under it in the same trace.
CREATE OR REPLACE VIEW agents AS
SELECT DISTINCT ON (trace_id, span_id) * FROM (
SELECT
    record_id,
    CASE WHEN g."gen_ai.operation.name" IN ('invoke_agent', 'create_agent', 'invoke_workflow')
              THEN g."gen_ai.operation.name"
         WHEN g."openinference.span.kind" = 'AGENT' OR g."traceloop.span.kind" = 'agent' THEN 'invoke_agent'
         ELSE 'invoke_workflow' END                                          AS operation,
    coalesce(g."gen_ai.agent.name", g."agent.name",
             CASE WHEN g."openinference.span.kind" = 'AGENT' OR g."traceloop.span.kind" = 'agent'
                  THEN coalesce(g."traceloop.entity.name", name) END)       AS agent_name,
    g."gen_ai.agent.id"                                                      AS genai_agent_id,
    g."gen_ai.agent.description"                                             AS agent_description,
    coalesce(g."gen_ai.workflow.name",
             CASE WHEN g."openinference.span.kind" = 'CHAIN' OR g."traceloop.span.kind" = 'workflow'
                  THEN coalesce(g."traceloop.entity.name", name) END)       AS workflow_name,
    correlation_id, session_id, agent_id,
    start_time, end_time, duration_ns, status_code, trace_id, span_id, parent_span_id
FROM (SELECT *, genai_tool_fields(attributes) AS g FROM spans
      WHERE (genai_kind_is(attributes, 'gen_ai.operation.name', ['invoke_agent', 'create_agent', 'invoke_workflow'])
             OR genai_kind_is(attributes, 'openinference.span.kind', ['AGENT', 'CHAIN'])
             OR genai_kind_is(attributes, 'traceloop.span.kind', ['agent', 'workflow']))
        AND unambiguous(attributes)));

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
