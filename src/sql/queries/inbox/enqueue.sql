-- $1 key, $2 body, $3 headers, $4 object ('': none), $5 position, $6 correlation id,
-- $7 attempts, $8 next attempt, $9 enqueued at, $10 now, $11 delivery id, $12 route, $13 1
-- when a position equal to the watermark is stale (else 0).
-- The claim of the key (a done key past its retention is taken over) with its entry, unless
-- its object's watermark is past its position, or at it with $13 (stale at the door); one row
-- (the key and its due time) when it stored the entry.
INSERT INTO {table} AS cur (key, state, body, headers, object, position,
    correlation_id, attempts, next_at, enqueued_at, id, route, equal_stale)
SELECT $1, 'queued', $2, $3, NULLIF($4, ''), $5, $6, $7, $8, $9, $11, $12, $13
WHERE NOT EXISTS (
    SELECT 1 FROM {table}_objects AS w
    WHERE w.object = $4 AND (w.watermark > $5 OR ($13 = 1 AND w.watermark = $5))
        AND w.expires_at > $10
)
ON CONFLICT (key) DO UPDATE
    SET state = 'queued', body = EXCLUDED.body, headers = EXCLUDED.headers,
        object = EXCLUDED.object, position = EXCLUDED.position,
        correlation_id = EXCLUDED.correlation_id, attempts = EXCLUDED.attempts,
        next_at = EXCLUDED.next_at, enqueued_at = EXCLUDED.enqueued_at, lease_token = NULL,
        lease_until = NULL, last_error = NULL, expires_at = NULL, id = EXCLUDED.id,
        route = EXCLUDED.route, history = '', started_us = NULL, worker = NULL,
        equal_stale = EXCLUDED.equal_stale
    WHERE cur.state = 'done' AND cur.expires_at <= $10
RETURNING key, next_at AS at
