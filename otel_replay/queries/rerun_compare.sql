-- original vs rerun, side by side: for each rerun of a session (all sessions
-- when session_id is NULL), the original recording's fingerprint and outcome
-- beside the rerun's fingerprint, match, first divergence and verdicts.
-- Variables: session_id
WITH original AS (
    SELECT session_id,
           max(attributes ->> '$."replay.recording.fingerprint"') AS original_fingerprint,
           max(attributes ->> '$."replay.recording.outcome"')     AS original_outcome,
           min(start_time)                                         AS recorded_at
    FROM (SELECT DISTINCT ON (trace_id, span_id) * FROM spans
          WHERE replay_kind = 'recording' AND sealed_here(attributes, trace_id, span_id))
    GROUP BY session_id
), reruns AS (
    SELECT attributes ->> '$."replay.rerun.of_session"'                    AS session_id,
           attributes ->> '$."replay.rerun.id"'                            AS rerun_id,
           attributes ->> '$."replay.rerun.governance"'                    AS governance,
           TRY_CAST(attributes ->> '$."replay.rerun.matched"' AS BOOLEAN)  AS matched,
           attributes ->> '$."replay.rerun.fingerprint"'                   AS rerun_fingerprint,
           TRY_CAST(attributes ->> '$."replay.rerun.steps"' AS BIGINT)     AS steps,
           attributes ->> '$."replay.rerun.divergence"'                    AS divergence,
           attributes ->> '$."replay.rerun.verdicts"'                      AS verdicts,
           start_time                                                      AS rerun_at
    FROM (SELECT DISTINCT ON (trace_id, span_id) * FROM spans
          WHERE replay_kind = 'rerun' AND sealed_here(attributes, trace_id, span_id))
)
SELECT o.session_id, o.recorded_at, o.original_fingerprint, o.original_outcome,
       r.rerun_id, r.rerun_at, r.governance, r.matched, r.rerun_fingerprint, r.steps, r.divergence, r.verdicts
FROM original o
LEFT JOIN reruns r USING (session_id)
WHERE getvariable('session_id') IS NULL OR o.session_id = getvariable('session_id')
ORDER BY o.recorded_at, o.session_id, r.rerun_at;
