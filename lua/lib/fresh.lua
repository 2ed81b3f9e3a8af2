-- lib/fresh.lua: the freshness check of every script that changes a SKU's state (claims,
-- holds, the waitlist, expiry, restocks, compensations, a sharded SKU's transfers and pools,
-- the waiting room's joins, reads and admissions). It is prepended to those scripts when they
-- are loaded (src/scripts/), so each still runs as one atomic script; it only defines
-- functions.
--
-- The floor, an ARGV of each script that includes this (its header names which): "seq:inc",
-- the ledger's high-water mark of the state's sequence and the latest incarnation PostgreSQL
-- recorded for the state, as the calling gateway knows them ("seq" alone: incarnation 0). Both
-- only grow in PostgreSQL, and a gateway knows them before its first script call on a SKU
-- (src/freshness.rs), so a floor is never above the truth.
--
-- The state hash (KEYS[1], or the key a script passes as `state`) carries `seq` (bumped by every change, see claim.lua), `inc` (the
-- incarnation: a Redis-clock time, stamped by restore and advanced by rotate.lua, which
-- PostgreSQL records afterwards) and `stale` (set once the state is known older than the
-- ledger; only a restore, which rewrites the whole state, clears it).
--
-- Invariant: a state whose sequence is behind the ledger's mark, or whose incarnation is older
-- than one the ledger recorded, is an older copy (an old snapshot, a lost AOF tail, a lagging
-- replica): it never changes again, whatever its own moves made of its sequence since.

-- Why the state (`seq`, `inc` as read from it) is older than `floor`, or nil.
local function behind_floor(seq, inc, floor)
  local fseq, finc = string.match(floor or '', '^(%d+):?(%d*)$')
  -- Arithmetic turns the digits into numbers at a third of `tonumber`'s cost (claim.lua runs
  -- this on every call); the state's `seq` and `inc` are integers its scripts wrote.
  fseq, finc = (fseq or 0) + 0, (finc ~= nil and finc ~= '') and finc + 0 or 0
  local s, i = (seq or 0) + 0, (inc or 0) + 0
  if i < finc then
    return 'incarnation:' .. i .. '<' .. finc
  end
  if s < fseq then
    return 'behind:' .. s .. '<' .. fseq
  end
  return nil
end

-- Marks the state (`state`, default KEYS[1]) stale when `seq`/`inc` are older than `floor`;
-- returns whether it did.
local function close_if_behind(seq, inc, floor, state)
  local why = behind_floor(seq, inc, floor)
  if why then
    redis.call('HSETNX', state or KEYS[1], 'stale', why)
    return true
  end
  return false
end

-- The state (`state`, default KEYS[1]) checked against `floor`: nil when it may change;
-- 'lost' when it is missing (Redis lost it); 'stale' when it is marked stale or is older than
-- `floor` (marked stale here, so every gateway fails closed on it until restore).
local function state_unfit(floor, state)
  state = state or KEYS[1]
  local h = redis.call('HMGET', state, 'stock', 'stale', 'seq', 'inc')
  if not h[1] then
    return 'lost'
  end
  if h[2] or close_if_behind(h[3], h[4], floor, state) then
    return 'stale'
  end
  return nil
end
