-- $1 key, $2 token, $3 next attempt, $4 error, $5 now in µs, $6 the error as the attempt's
-- line keeps it.
UPDATE {table}
SET state = 'queued', next_at = $3, lease_token = NULL, lease_until = NULL, last_error = $4,
    {history_failed}
WHERE {held}
RETURNING key, next_at AS at
