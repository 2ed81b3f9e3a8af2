-- post.lua: the wrk script of ratio.sh. Every request is one claim of one unit, with one
-- fixed admission token (WRK_TOKEN, sent as a bearer token when set), so wrk builds the
-- request once and spends its time sending. done() prints one machine-readable line.
wrk.method = "POST"
wrk.body = '{"quantity":1}'
wrk.headers["Content-Type"] = "application/json"
local token = os.getenv("WRK_TOKEN")
if token ~= nil and token ~= "" then
  wrk.headers["Authorization"] = "Bearer " .. token
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "WRK_RESULT requests=%d duration_us=%d non2xx=%d connect=%d read=%d write=%d timeout=%d p50_us=%d p99_us=%d\n",
    summary.requests, summary.duration, e.status, e.connect, e.read, e.write, e.timeout,
    latency:percentile(50.0), latency:percentile(99.0)))
end
