local owner = string.sub(ARGV[1], 2, 17)
local renewed = 0
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 17) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  renewed = 1
end
if redis.call('GET', KEYS[2]) == owner then
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
return renewed
