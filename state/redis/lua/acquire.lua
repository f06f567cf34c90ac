-- KEYS[1] record key
-- ARGV: param_hash, owner, lease_us, retention_us, scope, subject_tag
local key = KEYS[1]
local now = now_us()
local st = redis.call('HGET', key, 'state')
if not st then
  local lu = now + tonumber(ARGV[3])
  local ea = now + tonumber(ARGV[4])
  -- never let the record vanish while its lease runs
  if ea < lu then
    ea = lu
  end
  redis.call('HSET', key,
    'state', 'IN_FLIGHT',
    'param_hash', ARGV[1],
    'owner', ARGV[2],
    'fence', '1',
    'lease_until_us', fmt(lu),
    'created_at_us', fmt(now),
    'updated_at_us', fmt(now),
    'expires_at_us', fmt(ea),
    'scope', ARGV[5],
    'subject_tag', ARGV[6])
  expire_at(key, ea)
  return reply('ACQUIRED', key, now)
end
-- the parameter hash is compared before the state: a tampered confirm is
-- refused even when the original finished
if redis.call('HGET', key, 'param_hash') ~= ARGV[1] then
  return reply('PARAM_MISMATCH', key, now)
end
return reply(state_outcome(st), key, now)
