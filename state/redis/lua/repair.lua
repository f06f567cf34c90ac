-- KEYS[1] record key
-- ARGV: ttl_ms, then field, value pairs of the whole record as PostgreSQL
-- holds it.
-- Overwrites the key with the truth, except that a terminal record is never
-- replaced by a non-terminal one: every terminal record in Redis was copied
-- from PostgreSQL, where terminal is final, so such a write can only be a
-- stale read racing a completion.
local key = KEYS[1]
local now = now_us()
local st = redis.call('HGET', key, 'state')
local incoming
for i = 2, #ARGV, 2 do
  if ARGV[i] == 'state' then
    incoming = ARGV[i + 1]
  end
end
if (st == 'DONE' or st == 'FAILED') and incoming ~= 'DONE' and incoming ~= 'FAILED' then
  return reply('KEPT', nil, now)
end
redis.call('DEL', key)
redis.call('HSET', key, unpack(ARGV, 2))
redis.call('PEXPIRE', key, ARGV[1])
return reply('OK', nil, now)
