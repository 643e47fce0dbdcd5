-- The facts rows of `spans` (run by compaction over the rows it compacts, see
-- otel_replay/storage/facts.py): decision_facts_in and outcome_facts_in from
-- views.sql, in the facts file's columns. `repeated` and `shared` are set afterwards.
SELECT 'decision' AS kind, fact_key(span_id) AS key, CAST(NULL AS BOOLEAN) AS repeated, CAST(NULL AS BOOLEAN) AS shared,
       trace_id, span_id, record_id,
       id_hi(record_id) AS id_hi, id_lo(record_id) AS id_lo, id_text(record_id) AS id_text,
       decision_type, confidence,
       CAST(NULL AS VARCHAR) AS decision_id, CAST(NULL AS BOOLEAN) AS outcome_correct,
       CAST(NULL AS TIMESTAMPTZ_NS) AS recorded_at
FROM decision_facts_in('spans')
UNION ALL
SELECT 'outcome', fact_key(decision_id), NULL, NULL,
       trace_id, span_id, outcome_id,
       id_hi(decision_id), id_lo(decision_id), id_text(decision_id),
       NULL, NULL,
       decision_id, outcome_correct, recorded_at
FROM outcome_facts_in('spans');
