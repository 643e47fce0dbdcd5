-- record spans: every span that is, or claims to be, a record (decision, outcome,
-- audit entry, gate) or carries a seal, with what verification needs: the
-- stored attributes, the promoted columns and the file each row came from.
-- A record span without a seal is reported by verify as unsealed.
SELECT record_id, name, epoch_ns(start_time) AS start_ns, attributes,
       correlation_id, session_id, agent_id, replay_kind, decision_type, filename
FROM read_parquet(getvariable('otel_replay_files'), hive_partitioning = true, union_by_name = true, filename = true)
WHERE replay_kind IN ('decision', 'outcome', 'audit_entry', 'gate')
   OR attributes ->> '$."replay.record.hash"' IS NOT NULL
ORDER BY filename;
