-- $1 key. The key's state.
SELECT state FROM {table} WHERE key = $1
