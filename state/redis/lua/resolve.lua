-- KEYS[1] record key
-- ARGV: state, result_status, result_headers, result_body, retention_us, result_ref
local key = KEYS[1]
local now = now_us()
local st = redis.call('HGET', key, 'state')
if not st then
  return reply('NOT_FOUND', nil, now)
end
if st == 'DONE' or st == 'FAILED' then
  return reply('NOT_OWNER', key, now)
end
finish(key, now, ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6])
return reply('OK', key, now)
