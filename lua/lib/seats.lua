-- lib/seats.lua: the best-available search on a seated SKU's map, shared by claim_seats.lua
-- (a buyer's claim) and lib/lifecycle.lua (a waitlist offer: the best seats for the entry's
-- quantity). Prepended to those scripts when they are loaded (src/scripts/); it only defines
-- functions and reads the map (the caller sets the bits it takes, in the same script).
--
-- `spec` names the candidate rows in order, best first: "offset:count:prefix;..." (offset:
-- the row's first bit in the map; prefix "A-1-": a seat's id is prefix .. its number; src/
-- seating/plan.rs `rows_spec`). `mode` is "b" (n adjacent seats in one row: the first row
-- that has them, the run stranding no seat nearest the row's middle) or "f" (the n best free
-- seats: rows in order, each row's nearest its middle first). API.md "Reserved seating".
--
-- Returns bits, ids (two lists of n) when found; nil, free (the candidate rows' free seats)
-- when fewer than n are free or mode "f" finds fewer; nil, free, largest (the most adjacent
-- free seats any candidate row has) when mode "b" finds no row with n adjacent.
--
-- Its cost does not grow with the hall: the free seats are found with BITPOS (a scan in C,
-- Redis 7's bit ranges), the row holding one by a binary search of `spec`, and a row's free
-- runs by BITPOS again; the best run start is chosen by arithmetic on each run, never seat by
-- seat (before, every claim parsed every row of `spec` and decoded whole rows in Lua: 370 us
-- of Redis per claim on a 200,000-seat hall, loadtest/seats.sh).
--
-- Keeps I1 with its callers: it only ever proposes seats whose bit is 0.
local function seat_search(map, spec, mode, n)
  if spec == '' then
    return nil, 0
  end
  local first = tonumber(string.match(spec, '^(%d+)'))
  -- The last entry starts after the last ';', looked for in the spec's tail, 64 bytes more at
  -- a time (an unanchored pattern ending in '$' would retry from every byte, and
  -- string.reverse copies byte by byte: 21 us on 500 rows).
  local tail, from = nil, #spec
  while not tail do
    from = math.max(1, from - 64)
    local k = string.find(spec, ';', from, true)
    if k then
      local after = string.find(spec, ';', k + 1, true)
      while after do
        k, after = after, string.find(spec, ';', after + 1, true)
      end
      tail = k + 1
    elseif from == 1 then
      tail = 1
    end
  end
  local lo_, lc_ = string.match(spec, '^(%d+):(%d+):', tail)
  local last = tonumber(lo_) + tonumber(lc_) - 1
  -- Bits past the map's end were never taken (a map is as long as its last taken seat needs).
  local mapbits = redis.call('STRLEN', map) * 8
  -- The first free seat in bits [from, to], or nil.
  local function free_in(from, to)
    if from > to then
      return nil
    end
    if from >= mapbits then
      return from
    end
    local p = redis.call('BITPOS', map, 0, from, math.min(to, mapbits - 1), 'BIT')
    if p >= 0 then
      return p
    end
    if to >= mapbits then
      return mapbits
    end
    return nil
  end
  -- The first taken seat in bits [from, to], or to + 1.
  local function taken_in(from, to)
    if from >= mapbits then
      return to + 1
    end
    local p = redis.call('BITPOS', map, 1, from, math.min(to, mapbits - 1), 'BIT')
    if p >= 0 then
      return p
    end
    return to + 1
  end
  -- The row entry at byte i of spec: offset, count, prefix, and the next entry's byte.
  local function entry(i)
    local o, c, p, j = string.match(spec, '^(%d+):(%d+):([^;]*);?()', i)
    return tonumber(o), tonumber(c), p, j
  end
  -- The byte of the last entry whose offset is at most bit f (entries are in bit order).
  local function row_at(f)
    local lo, hi, at = 1, #spec, 1
    while lo <= hi do
      local mid = math.floor((lo + hi) / 2)
      local st = 1
      if mid > 1 then
        local semi = string.find(spec, ';', mid - 1, true)
        st = semi and semi + 1 or #spec + 1
      end
      if st > #spec then
        hi = mid - 1
      else
        if tonumber(string.match(spec, '^(%d+)', st)) <= f then
          at, lo = st, st + 1
        else
          hi = mid - 1
        end
      end
    end
    return at
  end
  -- The best start of n adjacent seats among a row's free runs ({a, b}: seats a..b), nil for
  -- none, and the row's largest run. A start s is scored by twice its run's distance from the
  -- row's middle, |2s + n - 2 - c|, least at s = (c + 2 - n) / 2; a start that strands a seat
  -- (s = a + 1, or s + n = b) is kept only when every start does. The score falls then rises
  -- and at most two starts of a run are excluded, so the best start of a run is among the
  -- three next to that middle or to the run's ends: those are all scored (ties: the lower s).
  local function best_in_runs(runs, c)
    local best, bestd, any, anyd, largest = nil, nil, nil, nil, 0
    local m = math.floor((c + 2 - n) / 2)
    for _, r in ipairs(runs) do
      local a, b = r[1], r[2]
      if b - a + 1 > largest then
        largest = b - a + 1
      end
      local L, R = a, b - n + 1
      if L <= R then
        local cands = { L, L + 1, L + 2, L + 3, R - 3, R - 2, R - 1, R,
          m - 3, m - 2, m - 1, m, m + 1, m + 2, m + 3 }
        for _, s in ipairs(cands) do
          if s >= L and s <= R then
            local d = math.abs(2 * s + n - 2 - c)
            if not anyd or d < anyd or (d == anyd and s < any) then
              any, anyd = s, d
            end
            if s - a ~= 1 and b - s - n + 1 ~= 1
              and (not bestd or d < bestd or (d == bestd and s < best)) then
              best, bestd = s, d
            end
          end
        end
      end
    end
    return best or any, largest
  end

  local bits, ids = {}, {}
  local largest, free_total = 0, 0
  local f = free_in(first, last)
  local i = 1
  if f then
    local o, c = entry(1)
    if o + c - 1 < f then
      i = row_at(f)
    end
  end
  while f and i <= #spec do
    local o, c, p, j = entry(i)
    local row_end = o + c - 1
    if row_end >= f then
      -- The row's free runs, as seat numbers.
      local runs, pos, free = {}, math.max(o, f), 0
      while pos <= row_end do
        if #runs == 3 or c <= 64 then
          -- A short row, or a fragmented one (late in a drop, singles everywhere): two calls a
          -- run would cost more than reading the rest of the row once and decoding it here.
          local from = math.floor(pos / 8)
          local bytes = redis.call('GETRANGE', map, from, math.floor(row_end / 8))
          local run_a = nil
          for at = pos, row_end + 1 do
            local byte = string.byte(bytes, math.floor(at / 8) - from + 1) or 0
            local is_free = at <= row_end and math.floor(byte / 2 ^ (7 - at % 8)) % 2 == 0
            if is_free and not run_a then
              run_a = at
            elseif not is_free and run_a then
              runs[#runs + 1] = { run_a - o + 1, at - o }
              free = free + at - run_a
              run_a = nil
            end
          end
          break
        end
        local a = free_in(pos, row_end)
        if not a then
          break
        end
        local b = taken_in(a, row_end) - 1
        runs[#runs + 1] = { a - o + 1, b - o + 1 }
        free = free + b - a + 1
        pos = b + 2
      end
      if mode == 'b' then
        local s, l = best_in_runs(runs, c)
        if l > largest then
          largest = l
        end
        if s then
          for k = s, s + n - 1 do
            bits[#bits + 1], ids[#ids + 1] = o + k - 1, p .. k
          end
          break
        end
      else
        -- Any seats: this row's free seats nearest its middle first (ties: the lower number).
        local order = {}
        for _, r in ipairs(runs) do
          for x = r[1], r[2] do
            order[#order + 1] = x
          end
        end
        table.sort(order, function(x, y)
          local dx, dy = math.abs(2 * x - c - 1), math.abs(2 * y - c - 1)
          return dx < dy or (dx == dy and x < y)
        end)
        for _, x in ipairs(order) do
          if #bits < n then
            bits[#bits + 1], ids[#ids + 1] = o + x - 1, p .. x
          end
        end
        if #bits == n then
          break
        end
      end
      free_total = free_total + free
      f = free_in(row_end + 1, last)
    end
    -- The next row holding f: the next entry, or found by the search past full rows.
    if f and j <= #spec then
      local no, nc = entry(j)
      if no + nc - 1 >= f then
        i = j
      else
        i = row_at(f)
      end
    else
      i = #spec + 1
    end
  end
  if #bits < n then
    if mode == 'f' or free_total < n then
      return nil, free_total
    end
    return nil, free_total, largest
  end
  return bits, ids
end
