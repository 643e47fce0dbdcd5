-- The views over decision and outcome facts: decision_facts, first_outcomes
-- (and the macros decision_facts_over / first_outcomes_over they stand on),
-- used by calibration.sql and decision_summary.sql. Needs views.sql first (the
-- macros and the span_facts view it defines). Kept apart from views.sql so
-- that opening a dataset does not bind them; from a plain DuckDB, run
-- source.sql, views.sql, then this file.

-- spans_without_facts: the rows of the span files no facts file covers.
CREATE OR REPLACE VIEW spans_without_facts AS
SELECT * FROM spans WHERE NOT list_contains(fact_covered(), filename);

-- decision_facts: one row per decision span (record_id, its join key
-- id_hi/id_lo/id_text, decision_type, confidence): the same rows as
-- `decisions`. A stored row whose key no other row can share (not `repeated`
-- in its file, not `shared` by another facts file, not met among the live
-- rows) is taken as it is; every other row is counted once per
-- (trace_id, span_id), as `decisions` counts them.
CREATE OR REPLACE MACRO decision_facts_over(live_spans) AS TABLE
WITH live AS MATERIALIZED (
    SELECT fact_key(span_id) AS key, trace_id, span_id, record_id,
           id_hi(record_id) AS id_hi, id_lo(record_id) AS id_lo, id_text(record_id) AS id_text,
           decision_type, confidence
    FROM decision_facts_in(live_spans)
), others AS MATERIALIZED (
    SELECT key FROM span_facts WHERE kind = 'decision' AND shared AND key IS NOT NULL
    UNION
    SELECT key FROM live WHERE key IS NOT NULL
)
SELECT record_id, id_hi, id_lo, id_text, decision_type, confidence
FROM span_facts
WHERE kind = 'decision' AND NOT repeated AND key IS NOT NULL AND key NOT IN (SELECT key FROM others)
UNION ALL
SELECT record_id, id_hi, id_lo, id_text, decision_type, confidence FROM (
    SELECT DISTINCT ON (trace_id, span_id) * FROM (
        SELECT trace_id, span_id, record_id, id_hi, id_lo, id_text, decision_type, confidence FROM span_facts
        WHERE kind = 'decision' AND repeated
        UNION ALL
        SELECT trace_id, span_id, record_id, id_hi, id_lo, id_text, decision_type, confidence FROM span_facts
        WHERE kind = 'decision' AND NOT repeated AND key IN (SELECT key FROM others)
        UNION ALL
        SELECT trace_id, span_id, record_id, id_hi, id_lo, id_text, decision_type, confidence FROM live));

CREATE OR REPLACE VIEW decision_facts AS
SELECT * FROM decision_facts_over('spans_without_facts');

-- first_outcomes: the first outcome of each decision (decision_id, its join
-- key id_hi/id_lo/id_text, outcome_correct): the same as `outcomes`' columns.
-- A stored outcome whose decision key no other row can share is the first of
-- its decision; the others are ranked as `outcomes` ranks them (recorded_at,
-- then span_id).
-- first_outcomes_over('name'): the same, with the live outcome facts taken
-- from `name` (columns of live_outcome_facts below; materialize it, it is
-- read twice).
CREATE OR REPLACE MACRO first_outcomes_over(live_facts) AS TABLE
WITH others AS MATERIALIZED (
    SELECT key FROM span_facts WHERE kind = 'outcome' AND shared AND key IS NOT NULL
    UNION
    SELECT key FROM query_table(live_facts) WHERE key IS NOT NULL
)
SELECT decision_id, id_hi, id_lo, id_text, outcome_correct
FROM span_facts
WHERE kind = 'outcome' AND NOT repeated AND key IS NOT NULL AND key NOT IN (SELECT key FROM others)
UNION ALL
SELECT decision_id, id_hi, id_lo, id_text, outcome_correct FROM (
    SELECT decision_id, id_hi, id_lo, id_text, outcome_correct, recorded_at, span_id FROM span_facts
    WHERE kind = 'outcome' AND repeated
    UNION ALL
    SELECT decision_id, id_hi, id_lo, id_text, outcome_correct, recorded_at, span_id FROM span_facts
    WHERE kind = 'outcome' AND NOT repeated AND key IN (SELECT key FROM others)
    UNION ALL
    SELECT decision_id, id_hi, id_lo, id_text, outcome_correct, recorded_at, span_id FROM query_table(live_facts)
)
QUALIFY row_number() OVER (PARTITION BY decision_id ORDER BY recorded_at, span_id) = 1;

-- live_outcome_facts: the outcome facts of the spans no facts file covers.
CREATE OR REPLACE VIEW live_outcome_facts AS
SELECT fact_key(decision_id) AS key, decision_id,
       id_hi(decision_id) AS id_hi, id_lo(decision_id) AS id_lo, id_text(decision_id) AS id_text,
       outcome_correct, recorded_at, span_id
FROM outcome_facts_in('spans_without_facts');

CREATE OR REPLACE VIEW first_outcomes AS
WITH live AS MATERIALIZED (SELECT * FROM live_outcome_facts)
SELECT * FROM first_outcomes_over('live');
