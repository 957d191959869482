-- $1 key, $2 retention end. A row when it discarded. The watermark stays: the dead letter
-- was not applied.
UPDATE {table}
SET state = 'done', body = NULL, headers = NULL, last_error = NULL, expires_at = $2
WHERE key = $1 AND state = 'dead'
RETURNING key
