-- record spans: every span that is, or claims to be, a record (decision, outcome,
-- audit entry, gate) or carries a seal, with what verification needs: the
-- stored attributes, the promoted columns and the file each row came from.
-- A record span without a seal is reported by verify as unsealed.
SELECT record_id, name, trace_id, span_id, epoch_ns(start_time) AS start_ns, attributes,
       correlation_id, session_id, agent_id, replay_kind, decision_type,
       outcome_decision_id, outcome_correct, decision_confidence, filename
FROM spans
WHERE replay_kind IN ('decision', 'outcome', 'audit_entry', 'gate')
   OR name IN ('replay.decision', 'replay.outcome', 'replay.audit_entry', 'replay.gate')
   OR attributes ->> '$."replay.record.hash"' IS NOT NULL
ORDER BY filename, trace_id, span_id;
