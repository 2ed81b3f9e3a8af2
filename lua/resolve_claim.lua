-- resolve_claim.lua: settle a claim whose claim.lua call timed out, by reading.
--
-- KEYS[1]  the claim record <prefix>:{<sku>}:claim:<claim_id>
-- ARGV[1]  TTL in seconds of the fence
--
-- Returns the claim record ("claim_id|quantity|remaining|created_ms") when the claim won, or
-- nil when it did not. In the second case the key is set to "void" first, so a claim.lua call
-- for the same id still queued somewhere can no longer win (it answers "fenced").
--
-- Invariant: an uncertain outcome gets exactly one answer. Nothing is decremented here; the
-- only write is the fence, which makes "not won" final instead of "not won yet".
local record = redis.call('GET', KEYS[1])
if record then
  if record == 'void' then
    return nil
  end
  return record
end
redis.call('SET', KEYS[1], 'void', 'EX', tonumber(ARGV[1]))
return nil
