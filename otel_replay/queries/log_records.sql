-- Log records received over OTLP (otel-replay serve, /v1/logs and the gRPC
-- LogsService), one row each, over `log_source` (the dataset's logs/ files).
-- Join them to spans by trace_id and span_id (NULL when the record was
-- emitted outside a span). body and attributes are JSON text, redacted;
-- a body longer than 32,768 characters is kept as a JSON string, cut.
CREATE OR REPLACE VIEW log_records AS
SELECT
    time,
    observed_time,
    coalesce(time, observed_time)  AS logged_at,
    severity_number,
    severity_text,
    body,
    attributes,
    event_name,
    trace_id,
    span_id,
    service_name,
    scope_name,
    scope_version,
    resource_attributes,
    scope_attributes,
    flags,
    dropped_attributes_count,
    filename
FROM log_source;

-- The GenAI events among them (gen_ai.client.inference.operation.details,
-- gen_ai.choice, gen_ai.user.message, ...): what an instrumentation sends as
-- log records rather than span attributes. trace_id and span_id join
-- model_calls (and spans) to the model call the event belongs to.
CREATE OR REPLACE VIEW genai_events AS
SELECT
    logged_at,
    event_name,
    trace_id,
    span_id,
    service_name,
    coalesce(json_extract_string(attributes, '$."gen_ai.provider.name"'),
             json_extract_string(attributes, '$."gen_ai.system"'))  AS provider,
    json_extract_string(attributes, '$."gen_ai.operation.name"')   AS operation,
    body,
    attributes,
    scope_name
FROM log_records
WHERE event_name LIKE 'gen\_ai.%' ESCAPE '\';
