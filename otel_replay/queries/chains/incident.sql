-- incident chain: the cross-agent message timeline for one incident id.
-- Audit entries only, ordered by their writers' created_at; default 500 rows.
-- Returns (layer, event_time, record_id, body). Variables: chain_id (compared as text), chain_limit.
SELECT 'audit' AS layer, a.created_at AS event_time, a.entry_id AS record_id, to_json(a) AS body
FROM audit_entries AS a
WHERE a.correlation_id = CAST(getvariable('chain_id') AS VARCHAR)
ORDER BY a.created_at, a.entry_id, a.trace_id, a.span_id
LIMIT coalesce(getvariable('chain_limit'), 500);
