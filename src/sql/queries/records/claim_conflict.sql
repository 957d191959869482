-- A claim takes over a row in place only when it expired, or when it is the claim's own (sent
-- again).
ON CONFLICT (key) DO UPDATE
    SET state = 'in_flight', token = EXCLUDED.token, fingerprint = EXCLUDED.fingerprint,
        record = NULL, expires_at = EXCLUDED.expires_at, created_at = EXCLUDED.created_at
    WHERE cur.expires_at <= {now}
       OR (cur.state = 'in_flight' AND cur.token = EXCLUDED.token)
