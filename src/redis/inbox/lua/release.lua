local function release(c, key)
  if redis.call('GET', c) == key then redis.call('DEL', c) end
end
