-- causal tree: the span (root_trace_id, root_span_id) and all its descendants in
-- that trace, walked over parent_span_id with a recursive CTE, in depth-first
-- order. The root is pinned by trace and span id: span ids are unique only
-- within a trace, and another trace reusing the decision's span id must not
-- take over its tree. Each span counts once even if stored twice (an OTLP
-- retry); copies that differ are picked in a fixed order, never by file order.
-- A span is listed once even where parent ids make a loop (a copy of the decision
-- that names its own span or a descendant as its parent): the walk never steps onto a
-- span already on its path. It stops 64 levels below the decision.
-- Returns (depth, span_id, parent_span_id, name, replay_kind, record_id,
-- start_time, duration_ns, status_code, path). Variables: root_trace_id, root_span_id.
WITH RECURSIVE trace_spans AS (
    SELECT DISTINCT ON (span_id) span_id, parent_span_id, name, replay_kind, record_id,
           start_time, duration_ns, status_code
    FROM spans
    WHERE trace_id = getvariable('root_trace_id')
    ORDER BY span_id, start_time, name, parent_span_id, record_id, attributes
), tree AS (
    SELECT 0 AS depth, s.*, [epoch_ns(s.start_time)::VARCHAR || s.span_id] AS path, [s.span_id] AS walked
    FROM trace_spans AS s
    WHERE s.span_id = getvariable('root_span_id')
    UNION ALL
    SELECT t.depth + 1, c.*, list_append(t.path, epoch_ns(c.start_time)::VARCHAR || c.span_id),
           list_append(t.walked, c.span_id)
    FROM trace_spans AS c
    JOIN tree AS t ON c.parent_span_id = t.span_id
    WHERE t.depth < 64 AND NOT list_contains(t.walked, c.span_id)
)
SELECT depth, span_id, parent_span_id, name, replay_kind, record_id, start_time, duration_ns, status_code, path
FROM tree
ORDER BY path;
