-- $1 object, $2 position, $3 retention end, $4 now. The watermark raised to a position (an
-- expired one counts as none), for the retention.
INSERT INTO {table}_objects AS cur (object, watermark, expires_at)
VALUES ($1, $2, $3)
ON CONFLICT (object) DO UPDATE
    SET watermark = CASE WHEN cur.expires_at > $4 AND cur.watermark >= EXCLUDED.watermark
            THEN cur.watermark ELSE EXCLUDED.watermark END,
        expires_at = EXCLUDED.expires_at
