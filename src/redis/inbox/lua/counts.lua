local in_flight = redis.call('ZCOUNT', KEYS[1], '(' .. ARGV[2], '+inf')
local live = redis.call('ZCARD', KEYS[2])
local dead = redis.call('ZCARD', KEYS[3])
local oldest = false
local first = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
if first then oldest = redis.call('HGET', ARGV[1] .. 'e:' .. first, 'e') end
return {in_flight, live, dead, oldest}
