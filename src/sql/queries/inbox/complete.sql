-- $1 key, $2 token, $3 retention end, $4 now in µs. The key done (a done key keeps its first
-- retention, and its history), its attempt ended at $4 as succeeded; the entry's object and
-- position when the token holds the entry or already completed it (the done key keeps the
-- token: the worker's completion after the handler's `complete_in_tx` is not a lost lease).
UPDATE {table}
SET state = 'done', body = NULL, headers = NULL, lease_until = NULL, last_error = NULL,
    expires_at = CASE WHEN state = 'done' THEN expires_at ELSE $3 END,
    history = CASE WHEN state = 'running' AND started_us IS NOT NULL
        THEN {appended_succeeded} ELSE history END
WHERE key = $1 AND state IN ('running', 'done') AND lease_token = $2
RETURNING object, position
