-- Shared prelude, prepended to every idemgate script.
-- Times are integer microseconds since the epoch, taken from Redis TIME so
-- that every gateway instance judges leases by the same clock. Lua 5.1
-- numbers are doubles: exact up to 2^53, far beyond any microsecond epoch,
-- but tostring() would print them in exponent form, so every number that
-- is stored or passed to redis.call goes through fmt().
redis.replicate_commands()

local function fmt(n)
  return string.format('%.0f', n)
end

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- reply returns {outcome, now_us, field, value, ...}: the outcome, the clock
-- the script used and the whole record as HGETALL gives it (nothing when the
-- key is absent). The Go side decodes this one shape for every script.
local function reply(outcome, key, now)
  local r = {outcome, fmt(now)}
  if key then
    local h = redis.call('HGETALL', key)
    for i = 1, #h do
      r[#r + 1] = h[i]
    end
  end
  return r
end

local function state_outcome(st)
  if st == 'DONE' or st == 'FAILED' or st == 'UNKNOWN' then
    return st
  end
  return 'IN_FLIGHT'
end

-- expire_at makes the key vanish when its record's retention ends.
local function expire_at(key, expires_us)
  redis.call('PEXPIREAT', key, fmt(math.ceil(expires_us / 1000)))
end

-- finish writes a terminal state and its result; an empty ref means none
-- was recorded, and no field is kept for it.
local function finish(key, now, st, status, headers, body, retention_us, ref)
  local ea = now + tonumber(retention_us)
  redis.call('HSET', key,
    'state', st,
    'result_status', status,
    'result_headers', headers,
    'result_body', body,
    'updated_at_us', fmt(now),
    'expires_at_us', fmt(ea))
  if ref ~= '' then
    redis.call('HSET', key, 'result_ref', ref)
  else
    redis.call('HDEL', key, 'result_ref')
  end
  expire_at(key, ea)
end
