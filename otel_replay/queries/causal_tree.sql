-- causal tree: the span with span_id = root_span_id and all its descendants,
-- walked over parent_span_id with a recursive CTE, in depth-first order.
-- Each span counts once even if stored twice (an OTLP retry).
-- Returns (depth, span_id, parent_span_id, name, replay_kind, record_id,
-- start_time, duration_ns, status_code, path). Variables: root_span_id.
WITH RECURSIVE trace_spans AS (
    SELECT DISTINCT ON (span_id) span_id, parent_span_id, name, replay_kind, record_id,
           start_time, duration_ns, status_code
    FROM spans
    WHERE trace_id = (SELECT trace_id FROM spans WHERE span_id = getvariable('root_span_id') LIMIT 1)
), tree AS (
    SELECT 0 AS depth, s.*, [epoch_ns(s.start_time)::VARCHAR || s.span_id] AS path
    FROM trace_spans AS s
    WHERE s.span_id = getvariable('root_span_id')
    UNION ALL
    SELECT t.depth + 1, c.*, list_append(t.path, epoch_ns(c.start_time)::VARCHAR || c.span_id)
    FROM trace_spans AS c
    JOIN tree AS t ON c.parent_span_id = t.span_id
    WHERE t.depth < 64
)
SELECT depth, span_id, parent_span_id, name, replay_kind, record_id, start_time, duration_ns, status_code, path
FROM tree
ORDER BY path;
