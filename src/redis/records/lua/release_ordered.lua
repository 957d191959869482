local owner = string.sub(ARGV[1], 2, 17)
local released = 0
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 17) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  released = 1
end
if redis.call('GET', KEYS[2]) == owner then
  redis.call('DEL', KEYS[2])
end
return released
