-- $1 object, $2 position, $3 now, $4 1 when a position equal to the watermark is stale (else
-- 0). The object's watermark when the position is stale against it.
SELECT watermark FROM {table}_objects
WHERE object = $1 AND (watermark > $2 OR ($4 = 1 AND watermark = $2)) AND expires_at > $3
