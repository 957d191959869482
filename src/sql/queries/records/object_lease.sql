-- $1 object, $2 token, $3 lease (ms). Takes the object's lease for the token when free,
-- expired or the token's already: one row, the live watermark (or NULL); no row when another
-- claim holds the object.
{object_into}
VALUES ($1, $2, {now + $3 ms}, NULL, NULL, {now + $3 ms})
ON CONFLICT (object) DO UPDATE
    SET token = EXCLUDED.token, lease_until = EXCLUDED.lease_until,
        expires_at = {greatest}(cur.expires_at, EXCLUDED.lease_until)
    WHERE cur.token IS NULL OR cur.lease_until <= {now} OR cur.token = EXCLUDED.token
RETURNING CASE WHEN watermark_until > {now} THEN watermark END AS watermark
