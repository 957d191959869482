local f = redis.call('HMGET', KEYS[1], 's', 't', 'o', 'p', 'e', 'y')
if f[1] ~= 'r' or f[2] ~= ARGV[3] then return 0 end
redis.call('ZREM', KEYS[3], ARGV[2])
redis.call('HDEL', KEYS[1], 't')
if f[3] then release(ARGV[1] .. 'c:' .. f[3], ARGV[2]) end
local set = {'s', 'q', 'n', ARGV[5]}
if ARGV[4] ~= 'r' then set = {'s', 'd', 'x', ARGV[8] or ARGV[7]} end
local y = ended(f[6], ARGV[6], 'f', ARGV[7])
if y then set[5], set[6] = 'y', y end
redis.call('HSET', KEYS[1], unpack(set))
if ARGV[4] == 'r' then
  redis.call('ZADD', KEYS[2], ARGV[5], ARGV[2])
  redis.pcall('PUBLISH', ARGV[1] .. 'wake', ARGV[5])
  return 1
end
redis.call('ZREM', KEYS[2], ARGV[2])
redis.call('ZREM', KEYS[4], ARGV[2])
redis.call('ZADD', KEYS[5], f[5], ARGV[2])
if f[3] then
  redis.call('ZREM', ARGV[1] .. 'o:' .. f[3], f[4] .. ARGV[2])
  redis.pcall('PUBLISH', ARGV[1] .. 'wake', 0)
end
return 1
