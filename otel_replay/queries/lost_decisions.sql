-- lost decisions: the commit intents (gate records, executed = 'intent') filed under one
-- correlation id (or session id) whose decision has no readable decision span under that id.
-- A process that died inside its audit() block after gate.commit() left no decision span: the
-- intent sealed the decision as it was acted on, and a trade, directive or session chain shows
-- it from there. An intent whose decision is stored is left out here, so a chain of many gated
-- decisions reads the few intents it may show, not one per decision. Readable: what the
-- `decisions` view shows (the unambiguous() and sealed_here() rules of views.sql), checked only
-- for the decisions the intents name, so a trade without gates reads no decision's JSON here.
-- Returns record.sql's columns (rows for the seal check, never chosen here).
-- Variables: correlation_id, session_id (compared as text; give one, the other NULL; both
-- NULL: no row).
WITH intents AS MATERIALIZED (
    SELECT *, attributes ->> '$."replay.gate.decision_id"' AS decided FROM spans
    WHERE (getvariable('correlation_id') IS NULL OR correlation_id = CAST(getvariable('correlation_id') AS VARCHAR))
      AND (getvariable('session_id') IS NULL OR session_id = CAST(getvariable('session_id') AS VARCHAR))
      AND (getvariable('correlation_id') IS NOT NULL OR getvariable('session_id') IS NOT NULL)
      AND replay_kind = 'gate'
      AND attributes ->> '$."replay.gate.executed"' = 'intent'
), named AS MATERIALIZED (  -- materialized: the JSON checks below run on these rows only
    SELECT record_id, attributes, trace_id, span_id FROM spans
    WHERE (getvariable('correlation_id') IS NULL OR correlation_id = CAST(getvariable('correlation_id') AS VARCHAR))
      AND (getvariable('session_id') IS NULL OR session_id = CAST(getvariable('session_id') AS VARCHAR))
      AND replay_kind = 'decision'
      AND record_id IN (SELECT decided FROM intents)
), stored AS (
    SELECT record_id FROM named WHERE unambiguous(attributes) AND sealed_here(attributes, trace_id, span_id)
)
SELECT record_id, name, trace_id, span_id, epoch_ns(start_time) AS start_ns, attributes,
       correlation_id, session_id, agent_id, replay_kind, decision_type,
       outcome_decision_id, outcome_correct, decision_confidence, filename
FROM intents
WHERE decided NOT IN (SELECT record_id FROM stored)
ORDER BY filename, trace_id, span_id;
