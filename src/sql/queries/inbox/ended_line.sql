-- The line of the attempt the row runs (`attempts`, `started_us`, `worker`), ended at the
-- microseconds {at} as {outcome} (`s` or `f`) with the SQL text {error}: the stored form of
-- `history`.
CAST(attempts AS text) || '	' || CAST(started_us AS text) || '	'
                || CAST({greatest}(0, {at} - started_us) AS text) || '	{outcome}	' || COALESCE(worker, '')
                || '	' || {error}
