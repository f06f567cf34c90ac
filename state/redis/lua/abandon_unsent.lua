-- KEYS[1] record key
-- ARGV: owner, fence
-- The owner's request never reached the upstream. A fresh claim (fence 1)
-- is deleted so the next confirm acquires afresh; a claim made by a
-- takeover (an earlier attempt may have executed) only ends its lease,
-- like end_lease.lua.
local key = KEYS[1]
local now = now_us()
local h = redis.call('HMGET', key, 'state', 'owner', 'fence')
if not h[1] then
  return reply('NOT_OWNER', nil, now)
end
if h[1] ~= 'IN_FLIGHT' or h[2] ~= ARGV[1] or h[3] ~= ARGV[2] then
  return reply('NOT_OWNER', key, now)
end
if h[3] == '1' then
  redis.call('DEL', key)
  return reply('OK', nil, now)
end
redis.call('HSET', key, 'lease_until_us', fmt(now), 'updated_at_us', fmt(now))
return reply('OK', key, now)
