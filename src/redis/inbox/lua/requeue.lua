local f = redis.call('HMGET', KEYS[1], 's', 'o', 'p', 'e')
if f[1] ~= 'd' then return 0 end
redis.call('HSET', KEYS[1], 's', 'q', 'a', 0, 'n', ARGV[3])
redis.call('HDEL', KEYS[1], 'x')
redis.call('ZREM', KEYS[4], ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[2])
redis.call('ZADD', KEYS[3], f[4], ARGV[2])
if f[2] then redis.call('ZADD', ARGV[1] .. 'o:' .. f[2], 0, f[3] .. ARGV[2]) end
redis.pcall('PUBLISH', ARGV[1] .. 'wake', ARGV[3])
return 1
