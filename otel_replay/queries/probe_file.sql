-- probe_file: decode every value of one Parquet file (hashing each column), so a damaged
-- data page behind an intact footer raises here and the file can be named.
-- Parameter: the file's path, bound as `?` (the library's damaged-file probe runs this),
-- read as itself, not as a glob (`*`, `?` and `[` become one-character classes), and
-- binary columns as text, as queries/source.sql reads them (bytes that are not UTF-8 fail).
SELECT max(hash(COLUMNS(*))) FROM read_parquet(regexp_replace(?, '([*?\[])', '[\1]', 'g'), binary_as_string = true);
