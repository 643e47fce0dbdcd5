-- rerun events: the sealed `replay.recording` chunks of one session, in chunk
-- order, with what the seal check and rehydration need. Each chunk holds up to
-- 256 recorded calls (clock, entropy, HTTP, model, tool, decision) in
-- `replay.recording.events`; rerun_event_list.sql unnests them for analysts.
-- Rows are returned, never chosen: the caller verifies each one's seal.
-- Variables: session_id
SELECT record_id, name, trace_id, span_id, epoch_ns(start_time) AS start_ns, attributes,
       correlation_id, session_id, agent_id, replay_kind, decision_type, filename,
       TRY_CAST(attributes ->> '$."replay.recording.chunk"' AS BIGINT) AS chunk
FROM spans
WHERE (replay_kind = 'recording' OR name = 'replay.recording')
  AND session_id = getvariable('session_id')
ORDER BY chunk, filename, trace_id, span_id;
