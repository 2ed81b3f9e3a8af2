-- join_queue.lua: a visitor joins a SKU's waiting room, once (lib/queue.lua prepended).
--
-- KEYS[1..11] the queue keys (see lib/queue.lua)
-- KEYS[12]   the visitor's join counter (expires with its window)
-- ARGV[1]    the ticket (16 raw bytes: a function of the secret, the SKU and the visitor, so
--            the same visitor always names the same ticket)
-- ARGV[2]    the ticket's pre-queue order (its shuffle key from the committed seed, < 2^52)
-- ARGV[3]    joins a visitor may make per window
-- ARGV[4]    the window, ms
-- ARGV[5]    the visitor (the user whose per-user count tells a used admission)
-- ARGV[6]    floor: the ledger's mark and incarnation of the SKU's state (see lib/fresh.lua)
-- ARGV[7]    the line's floor: the highest line sequence PostgreSQL recorded (lib/queue.lua)
--
-- Returns {'lost'} or {'stale'} (fail closed; the state older than the floor is closed here),
-- {'overloaded', retry_ms}, {'closed'}, {'not_open', prequeue_ms}, or {'ok', created (1 new,
-- 0 the visitor's ticket already), <q_report>}.
--
-- Invariant: one ticket per visitor and SKU (the ticket is in the line or in the admitted set
-- at most once: ZADD only when it is in neither); a ticket joined before opens_at is ordered by
-- the seed, a later one after every earlier one (arrival order); the join counter throttles a
-- visitor, never an address. Every new ticket is logged (KEYS[11]) for PostgreSQL in the same
-- step, so a restore puts it back where it stood.
local ticket, user = ARGV[1], ARGV[5]
local now = q_now()
local unfit = q_unfit(ARGV[6], ARGV[7])
if unfit then
  return {unfit}
end
local n = redis.call('INCR', KEYS[12])
if n == 1 then
  redis.call('PEXPIRE', KEYS[12], tonumber(ARGV[4]))
end
if n > tonumber(ARGV[3]) then
  return {'overloaded', redis.call('PTTL', KEYS[12])}
end
if q_closed(now) then
  return {'closed'}
end
local created = 0
if not redis.call('ZSCORE', KEYS[3], ticket) and not redis.call('ZSCORE', KEYS[2], ticket) then
  local score
  if now < q_num(KEYS[4], 'opens_ms') then
    local from = q_num(KEYS[1], 'prequeue_ms')
    if from > 0 and now < from then
      return {'not_open', from}
    end
    score = ARGV[2]
  else
    score = 4503599627370496 + redis.call('HINCRBY', KEYS[1], 'seq', 1)
  end
  redis.call('ZADD', KEYS[2], score, ticket)
  redis.call('HSET', KEYS[10], ticket, user)
  redis.call('XADD', KEYS[11], '*', 'k', 'j', 't', ticket, 'v', user, 'o', score, 'n', q_next())
  created = 1
end
local r = q_report(ticket, user, now)
return {'ok', created, unpack(r)}
