-- causal tree: the span with span_id = root_span_id and all its descendants,
-- walked over parent_span_id with a recursive CTE, in depth-first order.
-- Returns (depth, span_id, parent_span_id, name, replay_kind, record_id,
-- start_time, duration_ns, status_code, path). Variables: root_span_id.
WITH RECURSIVE tree AS (
    SELECT 0 AS depth, s.span_id, s.parent_span_id, s.trace_id, s.name, s.replay_kind, s.record_id,
           s.start_time, s.duration_ns, s.status_code,
           [epoch_ns(s.start_time)::VARCHAR || s.span_id] AS path
    FROM spans AS s
    WHERE s.span_id = getvariable('root_span_id')
    UNION ALL
    SELECT t.depth + 1, c.span_id, c.parent_span_id, c.trace_id, c.name, c.replay_kind, c.record_id,
           c.start_time, c.duration_ns, c.status_code,
           list_append(t.path, epoch_ns(c.start_time)::VARCHAR || c.span_id)
    FROM spans AS c
    JOIN tree AS t ON c.parent_span_id = t.span_id AND c.trace_id = t.trace_id
    WHERE t.depth < 64
)
SELECT depth, span_id, parent_span_id, name, replay_kind, record_id, start_time, duration_ns, status_code, path
FROM tree
ORDER BY path;
