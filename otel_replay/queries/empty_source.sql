-- empty source: span_source over a registered empty Arrow table (otel_replay_empty_spans),
-- used when the dataset has no files yet, so every view still has its columns.
CREATE OR REPLACE VIEW span_source AS SELECT * FROM otel_replay_empty_spans;
