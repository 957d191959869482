-- The line of the attempt the row runs, its lease lost: another take took it over.
CAST(attempts AS text) || '	' || CAST(started_us AS text)
                || '		l	' || COALESCE(worker, '') || '	'
