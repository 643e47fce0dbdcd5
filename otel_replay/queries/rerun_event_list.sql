-- rerun event list: every recorded call of one session, one row each, in call
-- order (an analyst's view; the rerun itself verifies each chunk's seal first).
-- Variables: session_id
SELECT
    (e ->> 'q')::BIGINT  AS seq,
    e ->> 'b'            AS boundary,
    e ->> 'n'            AS name,
    e ->> 's'            AS stream,
    e ->> 'a'            AS arguments,
    e -> 'v'             AS value,
    e -> 'e'             AS error,
    e ->> 'ti'           AS trace_id,
    e ->> 'si'           AS span_id,
    e ->> 'th'           AS thread
FROM (
    SELECT DISTINCT ON (trace_id, span_id) attributes
    FROM spans
    WHERE replay_kind = 'recording' AND session_id = getvariable('session_id')
      AND sealed_here(attributes, trace_id, span_id)
) AS chunks,
LATERAL unnest(json_extract(chunks.attributes ->> '$."replay.recording.events"', '$[*]')) AS t(e)
ORDER BY seq;
