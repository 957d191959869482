-- $1 key, $2 token, $3 lease end.
UPDATE {table} SET lease_until = $3 WHERE {held}
