-- $1 key, $2 token.
DELETE FROM {table}
WHERE {live_claim}
