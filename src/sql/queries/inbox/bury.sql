-- $1 key, $2 token, $3 error, $4 now, $5 now in µs, $6 the error as the attempt's line keeps
-- it.
UPDATE {table}
SET state = 'dead', lease_token = NULL, lease_until = NULL, last_error = $3,
    {history_failed}
WHERE {held}
RETURNING key, $4 AS at
