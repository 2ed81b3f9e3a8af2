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
-- Keeps I1 with its callers: it only ever proposes seats whose bit is 0.
local function seat_search(map, spec, mode, n)
  local bits, ids = {}, {}
  local rows = {}
  for o, c, p in string.gmatch(spec, '(%d+):(%d+):([^;]*)') do
    rows[#rows + 1] = {tonumber(o), tonumber(c), p}
  end
  local first = rows[1][1]
  local last = rows[#rows][1] + rows[#rows][2] - 1
  local base = math.floor(first / 8) * 8
  local span = redis.call('GETRANGE', map, math.floor(first / 8), math.floor(last / 8))
  -- The row's free seats, 1-based: free[i] is seat i.
  local function free_of(o, c)
    local free = {}
    for i = 1, c do
      local at = o + i - 1 - base
      local byte = string.byte(span, math.floor(at / 8) + 1) or 0
      free[i] = math.floor(byte / 2 ^ (7 - at % 8)) % 2 == 0
    end
    return free
  end
  -- The best start of n adjacent seats in a row (nil: none), and the row's largest block.
  -- Twice the distance of a run's middle from the row's middle: |2s + n - 1 - (c + 1)|.
  local function best_in_row(free, c)
    local best, bestd, any, anyd, largest = nil, nil, nil, nil, 0
    local i = 1
    while i <= c do
      if free[i] then
        local a = i
        while i <= c and free[i] do
          i = i + 1
        end
        local b = i - 1
        if b - a + 1 > largest then
          largest = b - a + 1
        end
        for s = a, b - n + 1 do
          local d = math.abs(2 * s + n - 2 - c)
          if s - a ~= 1 and b - s - n + 1 ~= 1 and (not bestd or d < bestd) then
            best, bestd = s, d
          end
          if not anyd or d < anyd then
            any, anyd = s, d
          end
        end
      else
        i = i + 1
      end
    end
    return best or any, largest
  end
  local largest, free_total = 0, 0
  -- A row with no free seat is skipped unread: string.find scans the span for the next byte
  -- with a free bit at C speed, so the full rows in front of a filling hall (best rows sell
  -- first) cost a comparison each instead of a decode of every seat. `next_free` is that byte
  -- (1-based in `span`; #span + 1: none left in the span, where missing bytes are free).
  local next_free = 0
  for _, r in ipairs(rows) do
    local o, c, p = r[1], r[2], r[3]
    local lo, hi = math.floor((o - base) / 8) + 1, math.floor((o + c - 1 - base) / 8) + 1
    if next_free < lo then
      next_free = string.find(span, '[^\255]', lo) or (#span + 1)
    end
    local free = next_free <= hi and free_of(o, c)
    if free then
      if mode == 'b' then
        local s, l = best_in_row(free, c)
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
        for i = 1, c do
          if free[i] then
            order[#order + 1] = i
          end
        end
        table.sort(order, function(x, y)
          local dx, dy = math.abs(2 * x - c - 1), math.abs(2 * y - c - 1)
          return dx < dy or (dx == dy and x < y)
        end)
        for _, i in ipairs(order) do
          if #bits < n then
            bits[#bits + 1], ids[#ids + 1] = o + i - 1, p .. i
          end
        end
        if #bits == n then
          break
        end
      end
      for i = 1, c do
        if free[i] then
          free_total = free_total + 1
        end
      end
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
