-- KEYS[1] record key
-- ARGV: owner, fence
local key = KEYS[1]
local now = now_us()
local h = redis.call('HMGET', key, 'state', 'owner', 'fence', 'lease_until_us')
if not h[1] then
  return reply('NOT_FOUND', nil, now)
end
local expired = tonumber(h[4]) <= now
if h[1] ~= 'IN_FLIGHT' or h[3] ~= ARGV[2] or (h[2] ~= ARGV[1] and not expired) then
  return reply('NOT_OWNER', key, now)
end
redis.call('HSET', key, 'state', 'UNKNOWN', 'updated_at_us', fmt(now))
return reply('OK', key, now)
