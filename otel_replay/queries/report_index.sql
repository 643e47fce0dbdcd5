-- report index: the newest decisions (what `otel-replay ui` lists first), each with
-- the latest fix the gate stored for it (descriptive: as stored, not re-verified).
-- Returns (record_id, decision_type, agent_id, correlation_id, session_id, created_at, gate_fix).
-- Variables: index_limit (default 50).
WITH recent AS (
    SELECT DISTINCT ON (record_id) record_id, decision_type, agent_id, correlation_id, session_id, created_at
    FROM decisions
    ORDER BY record_id, created_at
), newest AS (
    SELECT * FROM recent
    ORDER BY created_at DESC, record_id
    LIMIT coalesce(getvariable('index_limit'), 50)
), fixes AS (
    SELECT attributes ->> '$."replay.gate.decision_id"' AS decision_id,
           attributes ->> '$."replay.gate.fix"'         AS fix,
           start_time
    FROM spans
    WHERE replay_kind = 'gate' AND attributes ->> '$."replay.gate.fix"' IS NOT NULL
)
SELECT n.*, (SELECT f.fix FROM fixes AS f WHERE f.decision_id = n.record_id
             ORDER BY f.start_time DESC LIMIT 1) AS gate_fix
FROM newest AS n
ORDER BY n.created_at DESC, n.record_id;
