local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 17) ~= string.sub(ARGV[1], 1, 17) then
  return {1, v}
end
local owner = string.sub(ARGV[1], 2, 17)
local holder = redis.call('GET', KEYS[2])
if holder and holder ~= owner then
  return {2}
end
redis.call('SET', KEYS[2], owner, 'PX', ARGV[2])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
local w = redis.call('GET', KEYS[3])
if w and string.len(w) == 16 and (less(ARGV[3], w) or (ARGV[4] == '1' and ARGV[3] == w)) then
  return {3, w}
end
return {0}
