-- KEYS[1] record key
-- ARGV: new_owner, fence, lease_us
local key = KEYS[1]
local now = now_us()
local h = redis.call('HMGET', key, 'state', 'fence', 'lease_until_us', 'expires_at_us')
if not h[1] then
  return reply('NOT_FOUND', nil, now)
end
if h[1] ~= 'IN_FLIGHT' or h[2] ~= ARGV[2] or tonumber(h[3]) > now then
  return reply(state_outcome(h[1]), key, now)
end
local lu = now + tonumber(ARGV[3])
local ea = tonumber(h[4])
redis.call('HINCRBY', key, 'fence', 1)
redis.call('HSET', key, 'owner', ARGV[1], 'lease_until_us', fmt(lu), 'updated_at_us', fmt(now))
if ea < lu then
  redis.call('HSET', key, 'expires_at_us', fmt(lu))
  expire_at(key, lu)
end
return reply('ACQUIRED', key, now)
