-- The row of key $1 is the live claim of the token in $2.
key = $1 AND state = 'in_flight' AND token = $2 AND expires_at > {now}
