-- $1 object, $2 position, $3 now. The object's watermark when it is at or past the position.
SELECT watermark FROM {table}_objects
WHERE object = $1 AND watermark >= $2 AND expires_at > $3
