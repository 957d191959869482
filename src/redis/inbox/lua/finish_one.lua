local function drop_payload(prefix, key)
  redis.call('DEL', prefix .. 'b:' .. key)
  redis.call('HDEL', prefix .. 'e:' .. key, 'h', 'n')
end
local function finish_one(prefix, retention, key, f, now, mark)
  local e, y = prefix .. 'e:' .. key, ended(f[5], now, 's', '')
  if y then
    redis.call('HSET', e, 's', 'k', 't', mark, 'y', y)
  else
    redis.call('HSET', e, 's', 'k', 't', mark)
  end
  redis.call('PEXPIRE', e, retention)
  if f[3] then
    redis.call('ZREM', prefix .. 'o:' .. f[3], f[4] .. key)
    release(prefix .. 'c:' .. f[3], key)
    local wk = prefix .. 'w:' .. f[3]
    local w = redis.call('GET', wk)
    local m = f[4]
    if w and string.len(w) == 16 and less(m, w) then m = w end
    redis.call('SET', wk, m, 'PX', retention)
  end
end
