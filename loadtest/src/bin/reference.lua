-- reference.lua: the bare reference's claim (loadtest/src/bin/reference.rs), one per request.
--
-- KEYS[1] stock (integer string), KEYS[2] per-user counts (hash user -> units)
-- ARGV[1] user, ARGV[2] quantity, ARGV[3] per-user limit
-- Returns the remaining stock (>= 0) on a win, -1 sold out, -2 limit reached, -3 no such SKU.
-- Invariant: stock never goes below 0 and no user passes the limit.
local stock = tonumber(redis.call('GET', KEYS[1]))
if not stock then return -3 end
local qty, limit = tonumber(ARGV[2]), tonumber(ARGV[3])
local held = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
if held + qty > limit then return -2 end
if qty > stock then return -1 end
redis.call('HINCRBY', KEYS[2], ARGV[1], qty)
return redis.call('DECRBY', KEYS[1], qty)
