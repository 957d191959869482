-- $1 after this key, $2 now, $3 limit, then the filter's $4 to $9 (see `matching.sql`), $10 1
-- to read bodies and headers (else NULL). Rows as `INFO_COLUMNS`, by key.
SELECT key, CASE WHEN $10 = 1 THEN body END, CASE WHEN $10 = 1 THEN headers END, {info_rest}
FROM {table}
WHERE key > $1 AND (state <> 'done' OR expires_at > $2) AND {matching}
ORDER BY key LIMIT $3
