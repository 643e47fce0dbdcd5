-- record rows: every stored row that claims to be a record (decision, outcome,
-- audit entry, gate) and matches one of the filters below, with what the seal
-- check and rehydration need. Rows are returned, never chosen: the caller
-- re-hashes and verifies each one (otel_replay.trust), so a copied, edited or
-- unsealed row cannot win by sorting first.
-- Variables (NULL to leave a filter off):
--   record_id         rows claiming this record id
--   decision_ids      outcome rows for any of these decision ids (a list)
--   gate_decision_id  gate rows for this decision id
SELECT record_id, name, trace_id, span_id, epoch_ns(start_time) AS start_ns, attributes,
       correlation_id, session_id, agent_id, replay_kind, decision_type, filename
FROM spans
WHERE (replay_kind IN ('decision', 'outcome', 'audit_entry', 'gate')
       OR name IN ('replay.decision', 'replay.outcome', 'replay.audit_entry', 'replay.gate'))
  AND (record_id = getvariable('record_id')
       OR (replay_kind = 'outcome'
           AND list_contains(getvariable('decision_ids'), attributes ->> '$."replay.outcome.decision_id"'))
       OR (replay_kind = 'gate'
           AND attributes ->> '$."replay.gate.decision_id"' = getvariable('gate_decision_id')))
ORDER BY filename, trace_id, span_id;
