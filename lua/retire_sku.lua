-- retire_sku.lua: take a SKU out of the active set, unless a gateway marked it since it was read.
--
-- KEYS[1]  the active set <prefix>:active (member = SKU, score = unix ms of its last mark)
-- ARGV[1]  the SKU
-- ARGV[2]  its score as the caller read it, before it found the SKU's journal, holds and
--          waitlist empty
--
-- Returns 1 when the SKU was removed now, 0 when it stays (its score changed: a gateway marked
-- it since the caller's read, and may be journaling for it) or is no longer there.
--
-- Invariant: a SKU leaves the set only if no mark landed between the caller's read of its
-- score and this call. Every script call that can journal for a SKU or give it holds is
-- preceded by a mark at most a second older (src/activity/), so whatever it writes after the
-- caller found the SKU empty is covered by a mark that makes this call keep the SKU (or, when
-- the mark lands after this call, adds the SKU back). Only this key is touched: the SKU's own
-- keys live in another slot, which is why the emptiness check cannot be part of this step.
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) == tonumber(ARGV[2]) then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return 1
end
return 0
