-- $1 key, $2 token, $3 fingerprint, $4 lease (ms). Inserts the row, or takes over in place a
-- row that expired (or is our own claim, sent again); returns a row only when the claim is ours.
{claim_into}
VALUES ($1, 'in_flight', $2, $3, NULL, {now + $4 ms}, {now})
{claim_conflict}
RETURNING true AS acquired
