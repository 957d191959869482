local v = redis.call('GET', KEYS[1])
if not v then
  return 0
end
if string.sub(v, 1, 17) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
local tag = string.byte(v, 1)
if (tag == 4 or tag == 5) and string.sub(v, 2, 4) == string.sub(ARGV[1], 2, 4) then
  return 2
end
return 0
