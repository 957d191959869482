local prefix, retention, durable, now = ARGV[1], ARGV[2], ARGV[3] == 'w', ARGV[4]
local out, done = {}, {}
for i = 5, #ARGV, 2 do
  local key = ARGV[i]
  local f = redis.call('HMGET', prefix .. 'e:' .. key, 's', 't', 'o', 'p', 'y')
  if f[1] == 'r' and f[2] == ARGV[i + 1] then
    drop_payload(prefix, key)
    finish_one(prefix, retention, key, f, now, durable and ARGV[i + 1] or '1')
    done[#done + 1] = key
    out[#out + 1] = 1
  elseif f[1] == 'k' and f[2] == ARGV[i + 1] then
    if durable then redis.pcall('SET', prefix .. 'fence', '1') end
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
if #done > 0 then
  for i = 1, 3 do redis.call('ZREM', KEYS[i], unpack(done)) end
end
return out
