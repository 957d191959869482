-- The stored history with the SQL text {line} appended as its last line, its first dropped
-- when it keeps {kept_attempts} already (`history::push`'s bound, in the statement).
CASE WHEN history = '' THEN {line}
            WHEN length(history) - length(replace(history, '
', '')) + 1 >= {kept_attempts}
            THEN substr(history, {find_text}(history, '
') + 1) || '
' || {line}
            ELSE history || '
' || {line} END
