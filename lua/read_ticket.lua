-- read_ticket.lua: one waiting-room ticket as its visitor sees it (lib/queue.lua prepended).
-- Reads only.
--
-- KEYS[1..7] the queue keys (see lib/queue.lua)
-- ARGV[1]    the ticket (16 raw bytes)
-- ARGV[2]    the visitor ("" for the admin: a used admission then reads expired after its ttl)
--
-- Returns {'lost'} (fail closed) or {'ok', <q_report>}.
--
-- Invariant: a position is a rank in the line (O(log n)); sold_out is read from the stock at
-- the moment of the read, so every waiting ticket reads it as soon as the stock is gone.
if q_lost() then
  return {'lost'}
end
local r = q_report(ARGV[1], ARGV[2], q_now())
return {'ok', unpack(r)}
