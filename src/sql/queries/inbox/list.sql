-- $1 after this key, $2 now, $3 limit, then the filter's $4 to $9 (see `matching.sql`). Rows
-- as `INFO_COLUMNS`, by key.
SELECT {info_columns} FROM {table}
WHERE key > $1 AND (state <> 'done' OR expires_at > $2) AND {matching}
ORDER BY key LIMIT $3
