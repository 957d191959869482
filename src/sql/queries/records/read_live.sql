-- $1 key. The live row holding the key, as a reserve that did not claim answers it.
SELECT false AS acquired, state, fingerprint, record, {ms until expires_at} AS left_ms FROM {table}
WHERE key = $1 AND expires_at > {now}
