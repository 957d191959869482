-- $1 key, $2 token, $3 fingerprint, $4 record, $5 retention (ms).
UPDATE {table}
SET state = 'completed', token = NULL, fingerprint = $3, record = $4, expires_at = {now + $5 ms}
WHERE {live_claim}
