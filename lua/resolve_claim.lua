-- resolve_claim.lua: settle a claim whose claim.lua call timed out, by reading.
--
-- KEYS[1]  the claim records hash of the claim id's bucket <prefix>:{<sku>}:claims:<bucket>
-- ARGV[1]  the claim id
-- ARGV[2]  TTL in seconds of the records hash
--
-- Returns the claim record (the remaining stock right after the claim won) when it won, or
-- nil when it did not. In the second case the field is set to "void" first, so a claim.lua
-- call for the same id still queued somewhere can no longer win (its HSETNX fails).
--
-- Invariant: an uncertain outcome gets exactly one answer. Nothing is decremented here; the
-- only write is the fence, which makes "not won" final instead of "not won yet".
local record = redis.call('HGET', KEYS[1], ARGV[1])
if record then
  if record == 'void' then
    return nil
  end
  return record
end
redis.call('HSET', KEYS[1], ARGV[1], 'void')
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]))
return nil
