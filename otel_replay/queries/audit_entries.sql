-- audit entries: all of them, or those of one correlation id, in the order they
-- were recorded. Returns the `audit_entries` view's columns.
-- Variables: correlation_id (compared as text; NULL for all), entry_limit (default 100).
SELECT *
FROM audit_entries
WHERE getvariable('correlation_id') IS NULL OR correlation_id = CAST(getvariable('correlation_id') AS VARCHAR)
ORDER BY recorded_at, entry_id
LIMIT coalesce(getvariable('entry_limit'), 100);
