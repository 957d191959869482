-- $1 object, $2 position (16 bytes), $3 retention (ms). Raises the watermark to the position
-- when it is higher (or there is none).
{object_into}
VALUES ($1, NULL, NULL, $2, {now + $3 ms}, {now + $3 ms})
ON CONFLICT (object) DO UPDATE
    SET watermark = EXCLUDED.watermark, watermark_until = EXCLUDED.watermark_until,
        expires_at = {greatest}(cur.expires_at, EXCLUDED.watermark_until)
    WHERE cur.watermark IS NULL OR cur.watermark_until <= {now}
       OR cur.watermark < EXCLUDED.watermark
