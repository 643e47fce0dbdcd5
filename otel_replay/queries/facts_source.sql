-- span_facts over compaction's facts files (otel_replay/storage/facts.py),
-- and fact_covered() naming the span files they stand for. The Store runs
-- this for calibration and decision_summary after checking each facts file
-- against the compacted files it lists; views.sql (and facts_none.sql) reset both.
-- Variables: otel_replay_fact_files (the facts files), otel_replay_fact_covered
-- (the span files they cover). Each path is read as itself, not as a glob:
-- `*`, `?` and `[` become one-character classes (a dataset at `runs[1]`
-- must not read `runs1`'s files).
CREATE OR REPLACE VIEW span_facts AS
SELECT * FROM read_parquet(
    list_transform(getvariable('otel_replay_fact_files'), lambda f: regexp_replace(f, '([*?\[])', '[\1]', 'g'))
);

CREATE OR REPLACE MACRO fact_covered() AS CAST(getvariable('otel_replay_fact_covered') AS VARCHAR[]);
