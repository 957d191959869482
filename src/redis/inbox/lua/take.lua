local prefix, now, lease_end, max = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
if redis.call('EXISTS', prefix .. 'paused') == 1 then return {} end
local head, tail = string.sub(ARGV[5], 1, 13), string.sub(ARGV[5], 16, 16)
local out, skipped, batch = {}, 0, max
while #out < max do
  local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', skipped, batch)
  local passed = skipped
  for _, key in ipairs(due) do
    if #out == max then break end
    local e = prefix .. 'e:' .. key
    local f = redis.call('HMGET', e, 's', 'o', 'p', 'h', 'c', 'a', 'n', 'e', 'i', 'r', 'y', 'eq')
    local runnable, stale = f[1] == 'q' or f[1] == 'r', 0
    if not runnable then
      redis.call('ZREM', KEYS[1], key)
    elseif f[2] then
      local current = redis.call('GET', prefix .. 'c:' .. f[2])
      if current and redis.call('HGET', prefix .. 'e:' .. current, 's') ~= 'r' then
        current = nil
      end
      local next = current
      if not next then next = redis.call('ZRANGE', prefix .. 'o:' .. f[2], 0, 0)[1] end
      if next ~= (current and key or f[3] .. key) then
        runnable = false
        skipped = skipped + 1
      else
        local w = redis.call('GET', prefix .. 'w:' .. f[2])
        if w and string.len(w) == 16 and (less(f[3], w) or (f[12] and w == f[3])) then
          stale = 1
        end
      end
    end
    if runnable then
      local i = #out
      local token = head .. string.char(math.floor(i / 256), i % 256) .. tail
      local attempts = (tonumber(f[6]) or 0) + 1
      local y = pushed(f[11], attempts .. '\t' .. now .. '\t\tr\t' .. ARGV[6] .. '\t')
      redis.call('HSET', e, 's', 'r', 't', token, 'a', attempts, 'y', y)
      if f[2] then redis.call('SET', prefix .. 'c:' .. f[2], key) end
      redis.call('ZADD', KEYS[1], lease_end, key)
      redis.call('ZADD', KEYS[2], lease_end, key)
      out[#out + 1] = {key, stale, token, f[4], f[2], f[3], f[5], attempts, f[7], f[8], f[9], f[10],
        f[12]}
    end
  end
  -- Every due entry was seen: those passed over wait behind their object's first.
  if #due < batch then break end
  batch = max - #out
  if skipped > passed then batch = math.max(batch, math.min(batch * 4, 100)) end
end
-- Short: the worker will wait, and the next enqueue is to wake it.
if #out < max then redis.call('SET', prefix .. 'idle', '1') end
return out
