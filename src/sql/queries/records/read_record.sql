-- $1 key. The live completed record, after a `complete` that updated no row.
SELECT record FROM {table}
WHERE key = $1 AND state = 'completed' AND expires_at > {now}
