-- record: the span of one record (decision, outcome, audit entry or gate) by record id,
-- with everything rehydration needs. Variables: record_id.
SELECT record_id, name, trace_id, span_id, epoch_ns(start_time) AS start_ns, attributes,
       correlation_id, session_id, agent_id, replay_kind, decision_type
FROM spans
WHERE record_id = getvariable('record_id') AND name IN ('replay.decision', 'replay.outcome', 'replay.audit_entry', 'replay.gate')
ORDER BY start_time
LIMIT 1;
