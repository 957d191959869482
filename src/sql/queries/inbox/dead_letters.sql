-- $1 limit. The dead entries, then `last_error`.
SELECT {entry_columns}, last_error FROM {table}
WHERE state = 'dead' ORDER BY enqueued_at, key LIMIT $1
