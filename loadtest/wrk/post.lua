-- post.lua: the wrk script of ratio.sh and drop.sh. Every request is one claim of one unit.
--
-- Buyers: WRK_TOKENS names a file of `user<TAB>token` lines (`dropgate token --count N`); the
-- requests cycle through them, each wrk thread from its own offset, each request carrying its
-- buyer's bearer token and `X-User` (the buyer of `reference`). Without WRK_TOKENS, one fixed
-- token (WRK_TOKEN, when set) on every request, built once.
--
-- WRK_IDEM (optional, with WRK_TOKENS): each request also carries `Idempotency-Key:
-- <WRK_IDEM>-<user>` (footprint.sh measures what a keyed winner costs Redis).
--
-- WRK_MAX_REQUESTS (optional): each thread stops after its share of that many responses, for
-- a drop of a fixed number of attempts. wrk itself still waits out -d (drop.sh interrupts it
-- once the attempts are answered), so each thread notes (CLOCK_REALTIME, through LuaJIT's ffi)
-- when it started and when its last response came: done() reports the first start and the last
-- response (first_us, last_us; 0 without WRK_MAX_REQUESTS). done() prints one
-- machine-readable line.
wrk.method = "POST"
wrk.body = '{"quantity":1}'
wrk.headers["Content-Type"] = "application/json"

local tokens_file = os.getenv("WRK_TOKENS")
local idem = os.getenv("WRK_IDEM") or ""
local threads_made = 0
local max_total = tonumber(os.getenv("WRK_MAX_REQUESTS") or "")

local all_threads = {}
function setup(thread)
  thread:set("id", threads_made)
  threads_made = threads_made + 1
  all_threads[#all_threads + 1] = thread
end

local now_us = function() return 0 end
if max_total then
  local ffi = require("ffi")
  ffi.cdef[[
    typedef struct { long tv_sec; long tv_nsec; } dg_timespec;
    int clock_gettime(int clock, dg_timespec *ts);
  ]]
  local ts = ffi.new("dg_timespec")
  now_us = function()
    ffi.C.clock_gettime(0, ts)
    return tonumber(ts.tv_sec) * 1000000 + math.floor(tonumber(ts.tv_nsec) / 1000)
  end
end
started_us, last_us = 0, 0

local users, tokens, n, i, head, tail = nil, nil, 0, 0, nil, nil
local budget, answered = nil, 0

function init(args)
  local id = tonumber(wrk.thread:get("id")) or 0
  started_us = now_us()
  local threads = tonumber(os.getenv("WRK_THREADS") or "1")
  if max_total then
    budget = math.floor(max_total / threads)
    if id == 0 then budget = budget + max_total % threads end
  end
  if tokens_file == nil or tokens_file == "" then
    local token = os.getenv("WRK_TOKEN")
    if token ~= nil and token ~= "" then
      wrk.headers["Authorization"] = "Bearer " .. token
    end
    return
  end
  users, tokens = {}, {}
  for line in io.lines(tokens_file) do
    local u, t = line:match("^([^\t]+)\t(.+)$")
    if u then
      n = n + 1
      users[n], tokens[n] = u, t
    end
  end
  -- Threads start apart, so two threads rarely send the same buyer at once.
  i = math.floor(n * id / threads)
  local host = wrk.headers["Host"] or (wrk.host .. ":" .. wrk.port)
  head = "POST " .. wrk.path .. " HTTP/1.1\r\nHost: " .. host ..
    "\r\nContent-Type: application/json\r\nContent-Length: " .. #wrk.body ..
    "\r\nAuthorization: Bearer "
  tail = "\r\n\r\n" .. wrk.body
end

if tokens_file ~= nil and tokens_file ~= "" then
  function request()
    i = i + 1
    if i > n then i = 1 end
    if idem ~= "" then
      return head .. tokens[i] .. "\r\nX-User: " .. users[i] .. "\r\nIdempotency-Key: " .. idem ..
        "-" .. users[i] .. tail
    end
    return head .. tokens[i] .. "\r\nX-User: " .. users[i] .. tail
  end
end

if max_total then
  function response(status, headers, body)
    answered = answered + 1
    if answered == budget then
      last_us = now_us()
      wrk.thread:stop()
    end
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  local first, last = 0, 0
  for _, t in ipairs(all_threads) do
    local s, l = tonumber(t:get("started_us")) or 0, tonumber(t:get("last_us")) or 0
    if s > 0 and (first == 0 or s < first) then first = s end
    if l > last then last = l end
  end
  io.write(string.format(
    "WRK_RESULT requests=%d duration_us=%d non2xx=%d connect=%d read=%d write=%d timeout=%d p50_us=%d p99_us=%d p999_us=%d first_us=%.0f last_us=%.0f\n",
    summary.requests, summary.duration, e.status, e.connect, e.read, e.write, e.timeout,
    latency:percentile(50.0), latency:percentile(99.0), latency:percentile(99.9), first, last))
end
