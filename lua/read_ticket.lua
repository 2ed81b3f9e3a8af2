-- read_ticket.lua: one waiting-room ticket as its visitor sees it (lib/fresh.lua and
-- lib/queue.lua prepended). Reads only, but for closing a state older than the floor.
--
-- KEYS[1..11] the queue keys (see lib/queue.lua)
-- ARGV[1]    the ticket (16 raw bytes)
-- ARGV[2]    the visitor ("" for the admin: a used admission then reads expired after its ttl)
-- ARGV[3]    floor: the ledger's mark and incarnation of the SKU's state (see lib/fresh.lua)
-- ARGV[4]    the line's floor (lib/queue.lua)
--
-- Returns {'lost'} or {'stale'} (fail closed) or {'ok', <q_report>}.
--
-- Invariant: a position is a rank in the line (O(log n)); sold_out is read from the stock at
-- the moment of the read, so every waiting ticket reads it as soon as the stock is gone. An
-- older state's line is never shown: its admissions would mint tokens the ledger's line did
-- not give, its positions and sold_out would be someone else's past.
local unfit = q_unfit(ARGV[3], ARGV[4])
if unfit then
  return {unfit}
end
local r = q_report(ARGV[1], ARGV[2], q_now())
return {'ok', unpack(r)}
