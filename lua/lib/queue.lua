-- lib/queue.lua: functions shared by the waiting room's scripts (src/queue/), prepended to
-- each after lib/fresh.lua; it defines no key of its own. Every script that includes it takes
-- these as KEYS[1..11]:
--
-- KEYS[1]  the queue hash {sku}:q: rate (admissions per second), ttl_ms (how long an admission
--          is valid), prequeue_ms (the pre-queue opens; 0: from the declare on), seq (arrival
--          counter), qseq (the line's own sequence: every join and every round that admits
--          adds one; PostgreSQL records the highest it holds, src/queue/tickets.rs),
--          owner / lease_until / fence (the admitting gateway's lease), last_ms /
--          credit (the admission schedule), first_ms (the first admission), admitted_total
-- KEYS[2]  the line: sorted set of waiting tickets (16 raw bytes) by order; a pre-queue ticket's
--          order is its shuffle key (< 2^52, from the committed seed), a later one's
--          2^52 + its arrival number (docs/waiting-room.md)
-- KEYS[3]  the admitted: sorted set of admitted tickets by admission time (unix ms, Redis clock)
-- KEYS[4]  the SKU's state hash (stock, stale, opens_ms, closes_ms)
-- KEYS[5]  the SKU's waitlist line
-- KEYS[6]  the SKU's expiry set (holds still held: units that may come back)
-- KEYS[7]  the SKU's per-user counts (an admitted visitor who bought has used the admission)
-- KEYS[8]  the admissions' expiries: hash ticket -> unix ms (Redis clock), fixed when admitted
-- KEYS[9]  the admissions not known to be used: sorted set ticket by expiry (unix ms); what
--          the overbook bound counts (admit_queue.lua)
-- KEYS[10] each ticket's visitor: hash ticket -> visitor (whose per-user count tells a used
--          admission)
-- KEYS[11] the line's log: a stream of its changes not yet recorded in PostgreSQL (joins:
--          k=j t=ticket v=visitor o=order n=qseq; admission rounds: k=a at=ms ex=expiry ms
--          n=qseq t=the tickets' 16 bytes each, concatenated), read and trimmed by the tickets'
--          recorder (src/queue/tickets.rs): what a restore rebuilds the line from
--
-- Invariant (I1, I3): the queue never moves stock or counts; it only decides who may claim,
-- and every ticket is in the line or in the admitted set, never both.

-- Redis's clock, in unix ms: every gateway's decision uses the same clock.
local function q_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Why the queue cannot decide, or nil: 'lost' when the SKU's state or the queue's settings
-- are missing (Redis lost them), 'stale' when the state is marked stale or older than `floor`
-- (the caller's "seq:inc", lib/fresh.lua), or the line's `qseq` is behind `qfloor` (the
-- highest line sequence PostgreSQL recorded, as the caller knows it): closed here, so every
-- gateway fails closed on it until restore. The line and the admitted set live beside the
-- state and come back with it from an older snapshot: joins and admissions move only the
-- line's own sequence, so the line is checked against its own floor too.
local function q_unfit(floor, qfloor)
  local unfit = state_unfit(floor, KEYS[4])
  if unfit then
    return unfit
  end
  if redis.call('EXISTS', KEYS[1]) == 0 then
    return 'lost'
  end
  local qseq = tonumber(redis.call('HGET', KEYS[1], 'qseq') or '0')
  local want = tonumber(qfloor or '0') or 0
  if qseq < want then
    redis.call('HSETNX', KEYS[4], 'stale', 'line-behind:' .. qseq .. '<' .. want)
    return 'stale'
  end
  return nil
end

-- The line's next sequence number (one per logged change).
local function q_next()
  return redis.call('HINCRBY', KEYS[1], 'qseq', 1)
end

local function q_num(key, field)
  return tonumber(redis.call('HGET', key, field) or '0') or 0
end

-- Whether the sale window has closed at `now` (closes_ms, Redis's clock, as claim.lua reads it).
local function q_closed(now)
  local closes = q_num(KEYS[4], 'closes_ms')
  return closes > 0 and now >= closes
end

-- What the SKU can give the line now: 'open' (units, nobody on the waitlist), 'sold_out' (no
-- units, and no hold that could give some back), 'wait' (no open units yet, some may come
-- back: a hold, or a waitlist served first).
local function q_supply()
  local stock = q_num(KEYS[4], 'stock')
  if stock > 0 then
    if redis.call('ZCARD', KEYS[5]) == 0 then
      return 'open'
    end
    return 'wait'
  end
  if redis.call('ZCARD', KEYS[6]) == 0 then
    return 'sold_out'
  end
  return 'wait'
end

-- One ticket as its visitor sees it at `now`, with what the ETA needs:
-- {state, position, admitted_ms, now, opens_ms, rate, recent, window_ms, waiting, expires_ms,
--  qseq, unrecorded} (qseq: the line's sequence now; unrecorded: the sequence of the oldest
--  entry still in the line's log, 0 when it is empty. A gateway answers a visitor only once
--  PostgreSQL holds the line that far and every log entry up to qseq was copied and trimmed:
--  a recorder trims only what it found consistent with the ledger, src/queue/tickets.rs)
-- state: 'admitted' | 'expired' | 'prequeue' | 'waiting' | 'sold_out' | 'closed' (in line at
-- or after closes_at: nobody is admitted any more) | 'none' (no such ticket); `recent` admissions happened in the last `window_ms` (the achieved rate).
-- An admission's expiry is the one fixed when it was made (KEYS[8]): a later change of
-- ttl_ms never shortens or lengthens it, so on Redis's clock admitted turns expired once.
local function q_report(ticket, user, now)
  local opens = q_num(KEYS[4], 'opens_ms')
  local rate = q_num(KEYS[1], 'rate')
  local first = q_num(KEYS[1], 'first_ms')
  local window, recent = 0, 0
  if first > 0 then
    window = math.min(10000, now - first)
    recent = redis.call('ZCOUNT', KEYS[3], now - window, now)
  end
  local waiting = redis.call('ZCARD', KEYS[2])
  local state, position, adm, exp = 'none', 0, 0, 0
  local a = redis.call('ZSCORE', KEYS[3], ticket)
  if a then
    adm = tonumber(a)
    -- An admission made before expiries were kept: its ttl as the settings say.
    exp = tonumber(redis.call('HGET', KEYS[8], ticket) or '') or adm + q_num(KEYS[1], 'ttl_ms')
    state = 'expired'
    if now < exp then
      state = 'admitted'
    elseif user ~= '' and tonumber(redis.call('HGET', KEYS[7], user) or '0') > 0 then
      -- Used in time: the visitor bought, so the admission did not lapse unused.
      state = 'admitted'
    end
  else
    local rank = redis.call('ZRANK', KEYS[2], ticket)
    if rank then
      if q_closed(now) then
        state = 'closed'
      elseif now < opens then
        state = 'prequeue'
      else
        position = rank + 1
        state = 'waiting'
        if q_supply() == 'sold_out' then
          state = 'sold_out'
        end
      end
    end
  end
  local unrecorded = 0
  local oldest = redis.call('XRANGE', KEYS[11], '-', '+', 'COUNT', 1)[1]
  if oldest then
    local f = oldest[2]
    for i = 1, #f, 2 do
      if f[i] == 'n' then unrecorded = tonumber(f[i + 1]) end
    end
  end
  return {state, position, adm, now, opens, rate, recent, window, waiting, exp,
    q_num(KEYS[1], 'qseq'), unrecorded}
end
