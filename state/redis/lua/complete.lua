-- KEYS[1] record key
-- ARGV: owner, fence, state, result_status, result_headers, result_body, retention_us, result_ref
local key = KEYS[1]
local now = now_us()
local h = redis.call('HMGET', key, 'state', 'owner', 'fence')
if not h[1] then
  return reply('NOT_OWNER', nil, now)
end
if h[2] ~= ARGV[1] or h[3] ~= ARGV[2] or (h[1] ~= 'IN_FLIGHT' and h[1] ~= 'UNKNOWN') then
  return reply('NOT_OWNER', key, now)
end
finish(key, now, ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8])
return reply('OK', key, now)
