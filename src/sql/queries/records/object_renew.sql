-- $1 object, $2 token, $3 lease (ms). Extends the object's lease when the token holds it.
UPDATE {objects} SET lease_until = {now + $3 ms}, expires_at = {greatest}(expires_at, {now + $3 ms})
WHERE object = $1 AND token = $2 AND lease_until > {now}
