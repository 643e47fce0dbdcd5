-- recorded sessions: every session with recording chunks, whether it was
-- finished (has a final chunk), how many calls it holds and its fingerprint.
SELECT
    session_id,
    count(*)                                                                     AS chunks,
    bool_or(TRY_CAST(attributes ->> '$."replay.recording.final"' AS BOOLEAN))    AS finished,
    max(attributes ->> '$."replay.recording.fingerprint"')                       AS fingerprint,
    min(start_time)                                                              AS recorded_at
FROM (SELECT DISTINCT ON (trace_id, span_id) * FROM spans
      WHERE replay_kind = 'recording' AND sealed_here(attributes, trace_id, span_id))
WHERE session_id IS NOT NULL
GROUP BY session_id
ORDER BY recorded_at, session_id;
