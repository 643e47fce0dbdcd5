-- trade chain, Spark SQL variant of chains/trade.sql (same rows; `body` is Spark's JSON of the same columns).
-- Needs a temp view `spans` over the dataset's live files (otel_replay.storage.live_files), read with
-- spark.sql.legacy.parquet.nanosAsLong=true: start_time and end_time are BIGINT nanoseconds there.
-- Parameters (named markers): :chain_id, :chain_limit. Filters the chain's spans first, then unpacks.
-- Storage schema version 2 columns (outcome_decision_id, outcome_correct, decision_confidence) are read
-- first, the JSON where they are NULL (version 1 files); read a dataset that mixes versions with
-- spark.read.option("mergeSchema", "true"), so every file's columns are in the frame.
WITH chain_spans AS (
    SELECT * FROM spans
    WHERE correlation_id = :chain_id
      AND (attributes IS NULL
           OR size(json_object_keys(attributes)) = size(array_distinct(json_object_keys(attributes))))
      AND (get_json_object(attributes, "$['replay.record.span']") IS NULL
           OR get_json_object(attributes, "$['replay.record.span']")
              = concat(coalesce(trace_id, '?'), '-', coalesce(span_id, '?')))
), deduped AS (
    SELECT * FROM (
        SELECT *, row_number() OVER (PARTITION BY trace_id, span_id ORDER BY start_time) AS copy_no
        FROM chain_spans
    ) WHERE copy_no = 1
), audit_entries AS (
    SELECT
        record_id                                                            AS entry_id,
        get_json_object(attributes, "$['replay.audit.event_type']")         AS event_type,
        get_json_object(attributes, "$['replay.audit.source_agent']")       AS source_agent,
        get_json_object(attributes, "$['replay.audit.target_agent']")       AS target_agent,
        correlation_id,
        session_id,
        try_cast(get_json_object(attributes, "$['replay.audit.created_at']") AS TIMESTAMP) AS created_at,
        get_json_object(attributes, "$['replay.audit.payload']")            AS payload,
        timestamp_micros(start_time DIV 1000)                                AS recorded_at,
        trace_id,
        span_id
    FROM deduped WHERE replay_kind = 'audit_entry'
), decisions AS (
    SELECT
        record_id,
        get_json_object(attributes, "$['replay.record.source']")            AS source,
        decision_type,
        agent_id,
        session_id,
        correlation_id,
        get_json_object(attributes, "$['replay.decision.rationale']")       AS rationale,
        coalesce(decision_confidence,
                 try_cast(get_json_object(attributes, "$['replay.decision.confidence']") AS DOUBLE)) AS confidence,
        get_json_object(attributes, "$['replay.action.type']")              AS action_type,
        try_cast(get_json_object(attributes, "$['replay.action.cost']") AS DOUBLE) AS action_cost,
        timestamp_micros(start_time DIV 1000)                                AS created_at,
        trace_id,
        span_id
    FROM deduped WHERE replay_kind = 'decision'
), outcome_spans AS (
    SELECT *, coalesce(outcome_decision_id,
                       get_json_object(attributes, "$['replay.outcome.decision_id']")) AS decision_id
    FROM spans
    WHERE replay_kind = 'outcome'
      AND (outcome_decision_id IN (SELECT record_id FROM decisions)
           OR (outcome_decision_id IS NULL
               AND get_json_object(attributes, "$['replay.outcome.decision_id']") IN (SELECT record_id FROM decisions)))
      AND (attributes IS NULL
           OR size(json_object_keys(attributes)) = size(array_distinct(json_object_keys(attributes))))
      AND (get_json_object(attributes, "$['replay.record.span']") IS NULL
           OR get_json_object(attributes, "$['replay.record.span']")
              = concat(coalesce(trace_id, '?'), '-', coalesce(span_id, '?')))
), outcomes AS (
    SELECT * FROM (
        SELECT
            record_id                                                        AS outcome_id,
            decision_id,
            coalesce(outcome_correct,
                     try_cast(get_json_object(attributes, "$['replay.outcome.correct']") AS BOOLEAN)) AS outcome_correct,
            get_json_object(attributes, "$['replay.outcome.note']")         AS outcome_note,
            row_number() OVER (PARTITION BY decision_id ORDER BY start_time, span_id) AS rank_in_decision
        FROM outcome_spans
    ) WHERE rank_in_decision = 1
), audit AS (
    SELECT 'audit' AS layer, created_at AS event_time, entry_id AS record_id, to_json(struct(a.*)) AS body,
           row_number() OVER (ORDER BY created_at ASC NULLS LAST, entry_id, trace_id, span_id) AS n
    FROM audit_entries AS a
), traces AS (
    SELECT 'trace' AS layer, t.created_at AS event_time, t.record_id, to_json(struct(t.*)) AS body,
           row_number() OVER (ORDER BY t.created_at ASC NULLS LAST, t.record_id, t.trace_id, t.span_id) AS n
    FROM (
        SELECT d.*, o.outcome_id, o.outcome_correct, o.outcome_note
        FROM decisions AS d LEFT JOIN outcomes AS o ON o.decision_id = d.record_id
    ) AS t
)
SELECT layer, event_time, record_id, body FROM audit WHERE n <= coalesce(:chain_limit, 100)
UNION ALL
SELECT layer, event_time, record_id, body FROM traces WHERE n <= coalesce(:chain_limit, 100)
ORDER BY event_time ASC NULLS LAST, layer, record_id, body
