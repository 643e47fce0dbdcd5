-- contract tool calls: what a contracts backtest runs through the engine. One
-- row per tool call a model asked for (the `model_calls` view's `tool_calls`
-- column, written by the instrumentors), and one row with call_index NULL for
-- a model call that asked for none (it is still a step of its session). Rows
-- come grouped by session and in the order the model calls started, each
-- response's calls in the order the model gave them.
--
-- A session is the spans' session id, or their correlation id when they carry
-- no session id (session_key_kind says which); model calls with neither are
-- left out (the backtest counts them). Arguments are there only when content
-- capture was on when the session ran (redacted, possibly cut); the tool's
-- result, error and side effect come from the `execute_tool` span that
-- answered the call (matched by call id within the session).
-- Variables: session_id (NULL: every session).
WITH chosen AS (
    SELECT
        coalesce(session_id, correlation_id)                       AS session_key,
        CASE WHEN session_id IS NULL THEN 'correlation' ELSE 'session' END AS session_key_kind,
        agent_id, agent_name, model, response_model, input_tokens, output_tokens, start_time,
        trace_id, span_id, status_code, error_type, tool_calls,
        CASE WHEN tool_calls IS NULL THEN []
             WHEN json_valid(tool_calls) AND json_type(tool_calls) = 'ARRAY'
                  THEN CAST(json_extract(tool_calls, '$[*]') AS JSON[])
        END                                                        AS listed
    FROM model_calls
    WHERE coalesce(session_id, correlation_id) IS NOT NULL
      AND (getvariable('session_id') IS NULL
           OR session_id = getvariable('session_id')
           OR (session_id IS NULL AND correlation_id = getvariable('session_id')))
),
dropped AS (
    SELECT trace_id, span_id,
           TRY_CAST(attributes ->> '$."replay.model.tool_calls.dropped"' AS BIGINT) AS dropped_calls
    FROM spans
    WHERE replay_kind = 'model'  -- only the instrumentors write the count, on their model spans
      AND attributes ->> '$."replay.model.tool_calls.dropped"' IS NOT NULL
),
steps AS (
    SELECT c.*, d.dropped_calls,
           row_number() OVER (PARTITION BY c.session_key ORDER BY c.start_time, c.trace_id, c.span_id) AS step
    FROM chosen c LEFT JOIN dropped d USING (trace_id, span_id)
),
calls AS (
    SELECT s.*, i AS call_index, s.listed[i + 1] AS entry
    FROM steps s, LATERAL unnest(
        CASE WHEN s.listed IS NULL OR len(s.listed) = 0 THEN [CAST(NULL AS BIGINT)]
             ELSE range(len(s.listed)) END) AS t(i)
),
results AS (
    SELECT coalesce(session_id, correlation_id) AS session_key, tool_call_id,
           arg_min(tool_result, start_time) AS tool_result,
           arg_min(side_effect, start_time) AS side_effect,
           bool_or(status_code = 'ERROR') AS tool_failed,
           arg_min(error_type, start_time) AS tool_error_type,
           count(*) AS executions
    FROM acts
    WHERE source = 'tool' AND tool_call_id IS NOT NULL AND coalesce(session_id, correlation_id) IS NOT NULL
    GROUP BY ALL
)
SELECT
    c.session_key                                   AS session_id,
    c.session_key_kind,
    c.agent_id,
    c.agent_name,
    c.step,
    c.call_index,
    c.entry ->> 'id'                                AS call_id,
    c.entry ->> 'name'                              AS tool,
    c.entry ->> 'arguments'                         AS arguments,
    (c.entry -> 'arguments') IS NOT NULL            AS arguments_recorded,
    c.listed IS NULL                                AS tool_calls_unreadable,
    coalesce(c.dropped_calls, 0)                    AS dropped_calls,
    c.model,
    c.response_model,
    c.input_tokens,
    c.output_tokens,
    c.status_code                                   AS model_status,
    c.error_type                                    AS model_error_type,
    c.start_time,
    c.trace_id,
    c.span_id,
    r.tool_result,
    r.side_effect,
    coalesce(r.tool_failed, false)                  AS tool_failed,
    r.tool_error_type,
    coalesce(r.executions, 0)                       AS executions
FROM calls c
LEFT JOIN results r ON r.session_key = c.session_key AND r.tool_call_id = (c.entry ->> 'id')
ORDER BY c.session_key, c.step, c.call_index NULLS FIRST;
