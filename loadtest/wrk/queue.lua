-- queue.lua: the wrk script of queue.sh, the waiting room under load.
--
-- WRK_MODE=join: POST /v1/skus/<WRK_SKU>/queue, cycling through the visitor tokens of
-- WRK_TOKENS (`user<TAB>token` lines, `dropgate token --visitor --count N`), each thread from
-- its own offset; the ticket id of every 201 is appended to WRK_TICKETS_OUT.<thread>.
-- WRK_MODE=read: GET /v1/queue/<ticket>, cycling through the ticket ids of WRK_TICKETS (one a
-- line) with the admin token WRK_ADMIN (a position read).
-- done() prints one machine-readable line: WRK_QUEUE requests=… p50_us=… p99_us=… s201=…
-- s200=… s429=… other=… (status counts summed over the threads).
local mode = os.getenv("WRK_MODE") or "join"
local threads_made = 0
local all_threads = {}

function setup(thread)
  thread:set("id", threads_made)
  threads_made = threads_made + 1
  all_threads[#all_threads + 1] = thread
end

local function lines(path)
  local t = {}
  for l in io.lines(path) do t[#t + 1] = l end
  return t
end

local items, i, out
s201, s200, s429, other = 0, 0, 0, 0

function init(args)
  if mode == "join" then
    items = {}
    for _, l in ipairs(lines(os.getenv("WRK_TOKENS"))) do
      items[#items + 1] = l:match("\t(.*)$")
    end
    out = io.open(os.getenv("WRK_TICKETS_OUT") .. "." .. id, "w")
  else
    items = lines(os.getenv("WRK_TICKETS"))
  end
  i = (id * math.floor(#items / 2)) % #items
end

function request()
  i = i % #items + 1
  if mode == "join" then
    return wrk.format("POST", "/v1/skus/" .. os.getenv("WRK_SKU") .. "/queue",
      { ["Authorization"] = "Bearer " .. items[i], ["Content-Type"] = "application/json" }, "{}")
  end
  return wrk.format("GET", "/v1/queue/" .. items[i],
    { ["Authorization"] = "Bearer " .. os.getenv("WRK_ADMIN") })
end

function response(status, headers, body)
  if status == 201 then
    s201 = s201 + 1
    if out then
      out:write(body:match('"ticket_id"%s*:%s*"([^"]+)"'), "\n")
      out:flush()
    end
  elseif status == 200 then
    s200 = s200 + 1
  elseif status == 429 then
    s429 = s429 + 1
  else
    other = other + 1
    if other == 1 then io.stderr:write("first other answer: ", status, " ", body, "\n") end
  end
end

function done(summary, latency, requests)
  local c = { s201 = 0, s200 = 0, s429 = 0, other = 0 }
  for _, t in ipairs(all_threads) do
    for k in pairs(c) do c[k] = c[k] + (t:get(k) or 0) end
  end
  io.write(string.format(
    "WRK_QUEUE requests=%d duration_us=%d p50_us=%d p99_us=%d p999_us=%d s201=%d s200=%d s429=%d other=%d errors=%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    latency:percentile(99.9), c.s201, c.s200, c.s429, c.other,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout))
end
