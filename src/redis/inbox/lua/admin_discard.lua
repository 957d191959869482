if redis.call('HGET', KEYS[1], 's') ~= 'd' then return 0 end
redis.call('DEL', ARGV[1] .. 'b:' .. ARGV[2])
redis.call('HDEL', KEYS[1], 'h', 'n', 'x')
redis.call('HSET', KEYS[1], 's', 'k')
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('ZREM', KEYS[2], ARGV[2])
return 1
