local prefix, key, t, e = ARGV[1], ARGV[2], ARGV[5], KEYS[2]
local s = redis.call('HGET', e, 's')
if s then
  -- Durable: a write, so that the WAIT behind the script waits for the replicas to hold what
  -- was found (WAIT counts the writes of its own connection, and replicas apply in order).
  if ARGV[6] == 'w' then redis.pcall('SET', prefix .. 'fence', t) end
  if s == 'q' then return 1 elseif s == 'r' then return 2 elseif s == 'd' then return 3 end
  return 4
end
local due, o, p, eq, cap, fields = t, nil, nil, nil, nil, nil
for i = 6, #ARGV, 2 do
  local name, value = ARGV[i], ARGV[i + 1]
  if name == 'w' then
  elseif name == 'cap' then
    cap = tonumber(value)
  else
    fields = fields or {'s', 'q', 'c', ARGV[4], 'e', t}
    fields[#fields + 1] = name
    fields[#fields + 1] = value
    if name == 'n' then due = value end
    if name == 'o' then o = value end
    if name == 'p' then p = value end
    if name == 'eq' then eq = value end
  end
end
if o then
  -- Stale at the door: its object went past it already, or reached it and `eq` says an
  -- equal position is stale (the take's rule).
  local w = redis.call('GET', prefix .. 'w:' .. o)
  if w and string.len(w) == 16 and (less(p, w) or (eq and w == p)) then
    if ARGV[6] == 'w' then redis.pcall('SET', prefix .. 'fence', t) end
    return {6, w}
  end
end
if cap then
  local held = redis.call('ZCARD', prefix .. 'live') + redis.call('ZCARD', prefix .. 'dead')
  if held >= cap then return 5 end
end
if fields then
  redis.call('HSET', e, unpack(fields))
else
  redis.call('HSET', e, 's', 'q', 'c', ARGV[4], 'e', t)
end
redis.call('SET', prefix .. 'b:' .. key, ARGV[3])
if o then redis.call('ZADD', prefix .. 'o:' .. o, 0, p .. key) end
redis.call('ZADD', KEYS[1], due, key)
redis.call('ZADD', prefix .. 'live', t, key)
local idle = prefix .. 'idle'
if tonumber(due) > tonumber(t) then
  -- Due later: the waiting worker keeps the time, and the mark stays for an entry due now.
  if redis.call('EXISTS', idle) == 1 then redis.pcall('PUBLISH', prefix .. 'wake', due) end
elseif redis.call('DEL', idle) == 1 then
  redis.pcall('PUBLISH', prefix .. 'wake', due)
end
return 0
