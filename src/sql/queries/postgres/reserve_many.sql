-- $1 the keys, comma-separated, then as in `claim.sql`. One statement for the whole batch. The
-- keys are inserted in sorted order, so that two overlapping batches lock their rows in the
-- same order and never deadlock; each key is claimed atomically on its own, as by a reserve. A
-- key whose live row the statement's snapshot cannot see (claimed by a batch that committed
-- while this one waited for it) comes back with a NULL state, to be claimed again.
WITH batch AS (
    SELECT key, ord FROM unnest(string_to_array($1, ',')) WITH ORDINALITY AS batch (key, ord)
), claimed AS (
{claim_into}
SELECT key, 'in_flight', $2, $3, NULL, {now + $4 ms}, now()
FROM (SELECT DISTINCT key FROM batch) AS keys ORDER BY key
{claim_conflict}
RETURNING key
)
SELECT claimed.key IS NOT NULL AS acquired, live.state, live.fingerprint, live.record,
    {ms until live.expires_at} AS left_ms
FROM batch
LEFT JOIN claimed ON claimed.key = batch.key
LEFT JOIN {table} AS live
    ON claimed.key IS NULL AND live.key = batch.key AND live.expires_at > now()
ORDER BY batch.ord
