-- resolve_claim.lua: settle claims whose claim.lua call got no answer, by reading.
--
-- KEYS[1]  the claim records hash of the claim ids' bucket <prefix>:{<sku>}:claims:<bucket>
-- ARGV[1]  TTL in seconds of the records hash
-- ARGV[2..] the claim ids (all in that bucket)
--
-- Returns one integer per claim id, in order: the remaining stock right after the claim won
-- (>= 0), or -1 when it did not win. In the second case the field is set to "void" first, so
-- a claim.lua call for the same id still queued somewhere (a stalled Redis, a connection's
-- unread buffer) can no longer win: its HSETNX fails.
--
-- Invariant: an uncertain outcome gets exactly one answer. Nothing is decremented here; the
-- only write is the fence, which makes "not won" final instead of "not won yet".
local records = KEYS[1]
local out = {}
local fenced = false
for i = 2, #ARGV do
  local record = redis.call('HGET', records, ARGV[i])
  if record and record ~= 'void' then
    -- "remaining|quantity|len(user)|user" (claim.lua)
    out[#out + 1] = tonumber(string.match(record, '^(-?%d+)'))
  else
    if not record then
      redis.call('HSET', records, ARGV[i], 'void')
      fenced = true
    end
    out[#out + 1] = -1
  end
end
if fenced then
  redis.call('EXPIRE', records, tonumber(ARGV[1]))
end
return out
