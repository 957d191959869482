local out = {}
for _, key in ipairs(redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[2]) - 1)) do
  local g = redis.call('HMGET', ARGV[1] .. 'e:' .. key, 'x', 'h', 'o', 'p', 'c', 'a', 'n', 'e', 'i', 'r', 'eq')
  local b = redis.call('GET', ARGV[1] .. 'b:' .. key)
  out[#out + 1] = {key, g[1], b, g[2], g[3], g[4], g[5], g[6], g[7], g[8], g[9], g[10], g[11]}
end
return out
