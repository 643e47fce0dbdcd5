-- record rows: every stored row that claims to be a record (decision, outcome,
-- audit entry, gate) and matches one of the filters below, with what the seal
-- check and rehydration need. Rows are returned, never chosen: the caller
-- re-hashes and verifies each one (otel_replay.query.trust), so a copied, edited or
-- unsealed row cannot win by sorting first.
-- Variables (NULL to leave a filter off; ids are compared as text):
--   record_id         rows claiming this record id
--   decision_ids      outcome rows for any of these decision ids (a list)
--   gate_decision_id  gate rows for this decision id
--   gate_decision_ids gate rows for any of these decision ids (a list)
--   intent_correlation_id  commit intent rows (gate) of this correlation id
-- Each filter is its own branch, so the record id and the outcome's decision id
-- (promoted columns) reach the Parquet scan and a branch whose variable is NULL reads nothing; a row
-- matching two filters is returned once (the later branches leave out the
-- rows an earlier one returned).
WITH claimed AS (
    SELECT * FROM spans
    WHERE replay_kind IN ('decision', 'outcome', 'audit_entry', 'gate')
       OR name IN ('replay.decision', 'replay.outcome', 'replay.audit_entry', 'replay.gate')
)
SELECT record_id, name, trace_id, span_id, epoch_ns(start_time) AS start_ns, attributes,
       correlation_id, session_id, agent_id, replay_kind, decision_type,
       outcome_decision_id, outcome_correct, decision_confidence, filename
FROM (
    SELECT * FROM claimed
    WHERE getvariable('record_id') IS NOT NULL AND record_id = CAST(getvariable('record_id') AS VARCHAR)
    UNION ALL
    SELECT * FROM claimed
    WHERE getvariable('decision_ids') IS NOT NULL
      AND replay_kind = 'outcome'
      AND outcome_decision_id = ANY(getvariable('decision_ids'))  -- (not list_contains: = ANY filters in the scan)
      AND (getvariable('record_id') IS NULL OR record_id IS DISTINCT FROM CAST(getvariable('record_id') AS VARCHAR))
    UNION ALL
    SELECT * FROM claimed  -- a version 1 file's outcome: its decision id is in the JSON (see outcome_spans_for)
    WHERE getvariable('decision_ids') IS NOT NULL
      AND coalesce(getvariable('otel_replay_legacy_outcomes'), true)
      AND replay_kind = 'outcome'
      AND outcome_decision_id IS NULL
      AND list_contains(getvariable('decision_ids'), attributes ->> '$."replay.outcome.decision_id"')
      AND (getvariable('record_id') IS NULL OR record_id IS DISTINCT FROM CAST(getvariable('record_id') AS VARCHAR))
    UNION ALL
    SELECT * FROM claimed
    WHERE getvariable('gate_decision_id') IS NOT NULL
      AND replay_kind = 'gate'
      AND attributes ->> '$."replay.gate.decision_id"' = CAST(getvariable('gate_decision_id') AS VARCHAR)
      AND (getvariable('record_id') IS NULL OR record_id IS DISTINCT FROM CAST(getvariable('record_id') AS VARCHAR))
    UNION ALL
    SELECT * FROM claimed
    WHERE getvariable('gate_decision_ids') IS NOT NULL
      AND replay_kind = 'gate'
      AND list_contains(getvariable('gate_decision_ids'), attributes ->> '$."replay.gate.decision_id"')
      AND (getvariable('record_id') IS NULL OR record_id IS DISTINCT FROM CAST(getvariable('record_id') AS VARCHAR))
      AND (getvariable('gate_decision_id') IS NULL
           OR (attributes ->> '$."replay.gate.decision_id"') IS DISTINCT FROM CAST(getvariable('gate_decision_id') AS VARCHAR))
    UNION ALL
    SELECT * FROM claimed
    WHERE getvariable('intent_correlation_id') IS NOT NULL
      AND replay_kind = 'gate'
      AND correlation_id = CAST(getvariable('intent_correlation_id') AS VARCHAR)
      AND attributes ->> '$."replay.gate.executed"' = 'intent'
      AND getvariable('record_id') IS NULL AND getvariable('gate_decision_id') IS NULL
      AND getvariable('gate_decision_ids') IS NULL
)
ORDER BY filename, trace_id, span_id;
