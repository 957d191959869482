-- The attempt held ends at $5 as failed, with the error $6.
history = CASE WHEN started_us IS NOT NULL THEN {appended_failed} ELSE history END
