local f = redis.call('HMGET', KEYS[1], 's', 't')
if f[1] ~= 'r' or f[2] ~= ARGV[2] then
  -- Completed by its own lease (`complete_with`): still this worker's, nothing to extend.
  if f[1] == 'k' and f[2] == ARGV[2] then return 1 end
  return 0
end
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[1])
return 1
