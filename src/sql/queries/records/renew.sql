-- $1 key, $2 token, $3 lease (ms).
UPDATE {table} SET expires_at = {now + $3 ms}
WHERE {live_claim}
