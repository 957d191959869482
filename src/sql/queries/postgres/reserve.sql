-- The claim in a data-modifying CTE; when it wrote nothing, the live row is read back in the
-- same statement.
WITH claimed AS (
{claim}
)
SELECT true AS acquired, NULL::text AS state, NULL::bytea AS fingerprint, NULL::bytea AS record,
    NULL::bigint AS left_ms
FROM claimed
UNION ALL
{read_live} AND NOT EXISTS (SELECT 1 FROM claimed)
