if ARGV[1] == '1' then
  redis.call('SET', KEYS[1], '1')
  return 1
end
redis.call('DEL', KEYS[1])
redis.pcall('PUBLISH', ARGV[2] .. 'wake', ARGV[3])
return 1
