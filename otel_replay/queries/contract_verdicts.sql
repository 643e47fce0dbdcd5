-- Contract governance evidence: one row per enforcement decision a governed
-- session made (`otel_replay.govern()`), from its `replay.contract.decision`
-- spans. Needs `spans` (views.sql) first; the Store defines these views with
-- the others.
--
-- contract_decisions: the decision of one model response (or of one call of a
-- session tool the model did not ask for: api 'tools'). `outcome` is allow,
-- reject (the call raised ReplayContractError), strip (the blocked calls were
-- removed), text_only (every call was removed, the text kept) or logged
-- (log-only: nothing checked); `mode` is enforce, shadow (nothing was
-- blocked: what would have been) or log-only. `tools_dropped` counts calls
-- past the span's cap (decided, not listed).
-- `tools` is the JSON list of the response's calls ({call_id, name, allowed,
-- arguments}, arguments redacted), `failures` the JSON list of the rules that
-- failed ({rule, tool, call_id, path, detail, source}), `narrowed` the JSON
-- list of the tools hidden from the model before the call.
CREATE OR REPLACE VIEW contract_decisions AS
SELECT DISTINCT ON (trace_id, span_id) * FROM (
SELECT
    coalesce(attributes ->> '$."replay.contract.session_id"', session_id)          AS session_id,
    attributes ->> '$."replay.contract.agent"'                                      AS agent,
    TRY_CAST(attributes ->> '$."replay.contract.step"' AS BIGINT)                   AS step,
    attributes ->> '$."replay.contract.mode"'                                       AS mode,
    attributes ->> '$."replay.contract.outcome"'                                    AS outcome,
    attributes ->> '$."replay.contract.phase_before"'                               AS phase_before,
    attributes ->> '$."replay.contract.phase_after"'                                AS phase_after,
    TRY_CAST(attributes ->> '$."replay.contract.state_version"' AS BIGINT)          AS state_version,
    attributes ->> '$."replay.contract.digest"'                                     AS contracts_digest,
    attributes ->> '$."replay.contract.tools"'                                      AS tools,
    attributes ->> '$."replay.contract.failures"'                                   AS failures,
    attributes ->> '$."replay.contract.narrowed"'                                   AS narrowed,
    attributes ->> '$."replay.contract.provider"'                                   AS provider,
    attributes ->> '$."replay.contract.api"'                                        AS api,
    coalesce(TRY_CAST(attributes ->> '$."replay.contract.streamed"' AS BOOLEAN), false) AS streamed,
    coalesce(TRY_CAST(attributes ->> '$."replay.contract.tools.dropped"' AS BIGINT), 0) AS tools_dropped,
    CASE WHEN json_valid(attributes ->> '$."replay.contract.tools"')
         THEN json_array_length(attributes ->> '$."replay.contract.tools"') END     AS tool_calls,
    CASE WHEN json_valid(attributes ->> '$."replay.contract.tools"')
         THEN len(list_filter(
                  CAST(json_extract(attributes ->> '$."replay.contract.tools"', '$[*].allowed') AS VARCHAR[]),
                  lambda x: x = 'false')) END                                            AS blocked_calls,
    correlation_id,
    agent_id,
    start_time                                                                      AS recorded_at,
    trace_id,
    span_id,
    parent_span_id
FROM spans
WHERE name = 'replay.contract.decision' AND unambiguous(attributes));

-- contract_failures: one row per failed rule of every decision, unpacked from
-- its `failures` JSON (a decision whose failures are not a JSON array has none here).
CREATE OR REPLACE VIEW contract_failures AS
SELECT
    d.session_id, d.step, d.mode, d.outcome, d.recorded_at, d.trace_id, d.span_id,
    f ->> 'rule'    AS rule,
    f ->> 'tool'    AS tool,
    f ->> 'call_id' AS call_id,
    f ->> 'path'    AS path,
    f ->> 'detail'  AS detail,
    f ->> 'source'  AS source
FROM contract_decisions d,
     LATERAL unnest(CASE WHEN json_valid(d.failures) AND json_type(d.failures) = 'ARRAY'
                         THEN CAST(json_extract(d.failures, '$[*]') AS JSON[]) ELSE [] END) AS t(f);
