-- session chain: every decision of one agent session, in time order, with outcomes.
-- Traces only: a session lives inside one agent, so its reasoning is the story.
-- Returns (layer, event_time, record_id, body). Variables: chain_id (the session id), chain_limit (default 100).
WITH chain_decisions AS (
    SELECT * FROM decisions AS d WHERE d.session_id = getvariable('chain_id')
)
SELECT 'trace' AS layer, t.created_at AS event_time, t.record_id, to_json(t) AS body
FROM (
    SELECT d.*, o.outcome_id, o.outcome_correct, o.note AS outcome_note
    FROM chain_decisions AS d
    LEFT JOIN outcomes_of((SELECT coalesce(list(record_id), []) FROM chain_decisions)) AS o
        ON o.decision_id = d.record_id
) AS t
ORDER BY t.created_at, t.record_id
LIMIT coalesce(getvariable('chain_limit'), 100);
