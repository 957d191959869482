local bodies = ARGV[2] == '1'
local out = {}
for i = 3, #ARGV do
  local e = ARGV[1] .. 'e:' .. ARGV[i]
  local f = redis.call('HMGET', e, 's', 'x', 'y', 'h', 'o', 'p', 'c', 'a', 'n', 'e', 'i', 'r', 'eq')
  if not f[1] then
    out[i - 2] = {}
  else
    local body = false
    if bodies then
      body = redis.call('GET', ARGV[1] .. 'b:' .. ARGV[i])
    else
      f[4] = false
    end
    local ttl, lease = redis.call('PTTL', e), redis.call('ZSCORE', KEYS[1], ARGV[i])
    out[i - 2] = {f[1], f[2], f[3], body, ttl, lease, f[4], f[5], f[6], f[7], f[8], f[9], f[10],
      f[11], f[12], f[13]}
  end
end
return out
