-- The conditions of a `Filter`, each on when its parameter is not NULL: $4 state, $5 id
-- prefix, $6 route, $7 object, $8 correlation id, $9 error text. Exact on every row but the
-- error of an entry that is not dead, whose history (every attempt's error) is searched where
-- the filter reads only the last failed attempt's: what is read is checked again.
($4 IS NULL OR state = $4)
    AND ($5 IS NULL OR substr(id, 1, length($5)) = $5)
    AND ($6 IS NULL OR route = $6)
    AND ($7 IS NULL OR object = $7)
    AND ($8 IS NULL OR correlation_id = $8)
    AND ($9 IS NULL OR (state = 'dead' AND {find_text}(last_error, $9) > 0)
        OR (state <> 'dead' AND {find_text}(history, $9) > 0))
