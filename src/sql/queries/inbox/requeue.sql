-- $1 key, $2 now. A row when it re-queued.
UPDATE {table} SET state = 'queued', attempts = 0, next_at = $2, last_error = NULL
WHERE key = $1 AND state = 'dead'
RETURNING key, next_at AS at
