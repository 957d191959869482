local function last_line(y)
  local at, n, first = 1, 1, nil
  local nl = string.find(y, '\n', 1, true)
  while nl do
    first, at, n = first or nl, nl + 1, n + 1
    nl = string.find(y, '\n', at, true)
  end
  return at, n, first
end
local function pushed(y, line)
  if not y or y == '' then return line end
  local at, n, first = last_line(y)
  local last = string.gsub(string.sub(y, at), '^(%d+\t%d+\t)\tr\t', '%1\tl\t', 1)
  y = string.sub(y, 1, at - 1) .. last .. '\n' .. line
  if n >= 10 then y = string.sub(y, first + 1) end
  return y
end
local function ended(y, now, outcome, err)
  if not y then return nil end
  local at = last_line(y)
  local n, start, worker = string.match(y, '^(%d+)\t(%d+)\t\tr\t([^\t]*)\t$', at)
  if not n then return nil end
  local took = math.max(0, tonumber(now) - tonumber(start))
  return string.sub(y, 1, at - 1) .. n .. '\t' .. start .. '\t' .. string.format('%d', took)
    .. '\t' .. outcome .. '\t' .. worker .. '\t' .. err
end
