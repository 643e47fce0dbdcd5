-- No facts files: span_facts empty and fact_covered() empty, as views.sql
-- defines them (the Store runs this after a query that used facts files).
CREATE OR REPLACE VIEW span_facts AS
SELECT CAST(NULL AS VARCHAR) AS kind, CAST(NULL AS UBIGINT) AS key,
       CAST(NULL AS BOOLEAN) AS repeated, CAST(NULL AS BOOLEAN) AS shared,
       CAST(NULL AS VARCHAR) AS trace_id, CAST(NULL AS VARCHAR) AS span_id, CAST(NULL AS VARCHAR) AS record_id,
       CAST(NULL AS UBIGINT) AS id_hi, CAST(NULL AS UBIGINT) AS id_lo, CAST(NULL AS VARCHAR) AS id_text,
       CAST(NULL AS VARCHAR) AS decision_type, CAST(NULL AS DOUBLE) AS confidence,
       CAST(NULL AS VARCHAR) AS decision_id, CAST(NULL AS BOOLEAN) AS outcome_correct,
       CAST(NULL AS TIMESTAMPTZ_NS) AS recorded_at
WHERE false;

CREATE OR REPLACE MACRO fact_covered() AS CAST([] AS VARCHAR[]);
