local prefix, key, token = ARGV[1], ARGV[3], ARGV[4]
local f = redis.call('HMGET', KEYS[4], 's', 't', 'o', 'p', 'y')
if f[1] ~= 'r' or f[2] ~= token then
  if f[1] == 'k' and f[2] == token then
    if ARGV[5] == 'w' then redis.pcall('SET', prefix .. 'fence', '1') end
    return 2
  end
  return 0
end
drop_payload(prefix, key)
local i = 7
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  redis.call(unpack(ARGV, i + 1, i + n))
  i = i + n + 1
end
finish_one(prefix, ARGV[2], key, f, ARGV[6], token)
for j = 1, 3 do redis.call('ZREM', KEYS[j], key) end
return 1
