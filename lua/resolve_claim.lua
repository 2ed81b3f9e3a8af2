-- resolve_claim.lua: settle claims whose claim.lua call got no answer, by reading.
--
-- KEYS[1]  the call records hash of the claims' bucket <prefix>:{<sku>}:claims:<bucket>
-- ARGV[1]  TTL in seconds of the records hash
-- ARGV[2+2k], ARGV[3+2k]: per claim, its call id and its index in that call (src/ids.rs);
--          all calls in that bucket
--
-- Returns two integers per claim, in order: the remaining stock right after the claim won
-- (>= 0), or -1 when it did not win; and the hold's expiry (unix ms, Redis's clock) when the
-- call was decided on a SKU that holds its claims, else 0 (a win read back is answered as the
-- hold it is: status `held`, its `expires_at`). A call without a record did not run: its
-- field is set to "void" first, so the call, still queued somewhere (a stalled Redis, a
-- connection's unread buffer), can no longer run (claim.lua refuses a call id that has a
-- record). A call that ran has its winners in its record ("<stock before>|", or
-- "<stock before>:<expires_ms>|" for held winners, then "index|quantity|len(user)|user" per
-- winner, in claim order: claim.lua); its other claims did not win and moved nothing.
--
-- Keeps I5 (docs/invariants.md).
-- Invariant: an uncertain outcome gets exactly one answer. Nothing is decremented here; the
-- only write is the fence, which makes "not won" final instead of "not won yet" (once the
-- replicas hold it: the callers WAIT before they say so, src/claims/call.rs, src/settle.rs).
local records = KEYS[1]

-- The stock left right after claim `index` won, from its call's record, or -1.
local function remaining(record, index)
  local stock, pos = string.match(record, '^(-?%d+):?%d*|()')
  if not stock then
    return -1
  end
  stock = tonumber(stock)
  while pos <= #record do
    local i, qty, len, after = string.match(record, '^(%d+)|(%d+)|(%d+)|()', pos)
    if not i then
      return -1
    end
    stock = stock - tonumber(qty)
    if tonumber(i) == index then
      return stock
    end
    pos = after + tonumber(len)
  end
  return -1
end

local out, seen = {}, {}
local fenced = false
for k = 2, #ARGV, 2 do
  local call = ARGV[k]
  local record = seen[call]
  if record == nil then
    record = redis.call('HGET', records, call)
    if not record then
      redis.call('HSET', records, call, 'void')
      fenced = true
      record = 'void'
    end
    seen[call] = record
  end
  if record == 'void' then
    out[#out + 1] = -1
    out[#out + 1] = 0
  else
    local left = remaining(record, tonumber(ARGV[k + 1]))
    out[#out + 1] = left
    out[#out + 1] = left >= 0 and tonumber(string.match(record, '^-?%d+:(%d+)|') or '0') or 0
  end
end
if fenced then
  redis.call('EXPIRE', records, tonumber(ARGV[1]))
end
return out
