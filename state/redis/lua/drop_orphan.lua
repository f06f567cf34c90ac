-- KEYS[1] record key
-- ARGV: owner, fence
-- Deletes the key only while it is still this owner's IN_FLIGHT claim:
-- the tiered store drops a Redis claim that PostgreSQL never got (or has
-- just deleted), whatever its fence.
local key = KEYS[1]
local now = now_us()
local h = redis.call('HMGET', key, 'state', 'owner', 'fence')
if not h[1] then
  return reply('NOT_FOUND', nil, now)
end
if h[1] ~= 'IN_FLIGHT' or h[2] ~= ARGV[1] or h[3] ~= ARGV[2] then
  return reply('NOT_OWNER', key, now)
end
redis.call('DEL', key)
return reply('OK', nil, now)
