-- KEYS[1] record key
-- A script rather than HGETALL so that LeaseExpired is judged by the clock
-- of the node that holds the key, like every other call.
local key = KEYS[1]
local now = now_us()
if redis.call('EXISTS', key) == 0 then
  return reply('NOT_FOUND', nil, now)
end
return reply('FOUND', key, now)
