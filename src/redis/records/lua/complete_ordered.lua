local owner = string.sub(ARGV[1], 2, 17)
local done = 0
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 17) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  local w = redis.call('GET', KEYS[3])
  if not w or string.len(w) ~= 16 or less(w, ARGV[4]) then
    redis.call('SET', KEYS[3], ARGV[4], 'PX', ARGV[3])
  end
  done = 1
elseif v then
  local tag = string.byte(v, 1)
  if (tag == 4 or tag == 5) and string.sub(v, 2, 4) == string.sub(ARGV[1], 2, 4) then
    done = 2
  end
end
if redis.call('GET', KEYS[2]) == owner then
  redis.call('DEL', KEYS[2])
end
return done
