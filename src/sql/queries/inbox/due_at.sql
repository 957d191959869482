-- When an entry is due: a queued one at its next attempt, a running one when its lease runs
-- out. The take orders by it, and `<table>_take_idx` indexes it (the same expression, which
-- the planners match), so that a take reads the due entries in order and stops at its limit.
CASE WHEN state = 'queued' THEN next_at ELSE lease_until END
