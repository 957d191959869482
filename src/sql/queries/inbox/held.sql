-- The row of key $1 runs under the lease of the token $2.
key = $1 AND state = 'running' AND lease_token = $2
