# ratio-summary.awk: the summary of ratio.sh, from its results.tsv (one line per run):
#   1 type (won|sold_out) 2 kind (dropgate|reference|base|nofast) 3 conns 4 round 5 units sold
#   6 Redis CPU s 7 server CPU s 8 Redis commands 9 EVALSHAs (both "-" in older results of
#   winning runs) 10 requests 11 non-2xx
#   12 duration us 13 p50 us 14 p99 us 15 p99.9 us 16 socket errors
#   17 CPU s of the PostgreSQL backends of the gateway's database ("-": not measured)
# Ratios are taken per round (runs side by side) and shown as mean and range.
function ratio_line(what, a, b, c,    r, sum, lo, hi, n, x) {
  n = 0; sum = 0; lo = 1e18; hi = -1e18
  for (r = 1; r <= rounds; r++) {
    if (!((a, c, r) in rate) || !((b, c, r) in rate) || rate[b, c, r] == 0) continue
    x = rate[a, c, r] / rate[b, c, r]; n++; sum += x
    if (x < lo) lo = x
    if (x > hi) hi = x
  }
  if (n) printf "  %-44s %.3f (per round %.3f-%.3f)\n", what, sum / n, lo, hi
}
function max0(x) { return x < 0 ? 0 : x }
function mean(arr, k, c,    r, s, n) {
  n = 0; s = 0
  for (r = 1; r <= rounds; r++) if ((k, c, r) in arr) { s += arr[k, c, r]; n++ }
  return n ? s / n : 0
}
{
  t = $1; k = $2; c = $3; r = $4
  if (r > rounds) rounds = r
  if (t == "won") {
    seen_c[c] = 1; kinds[k] = 1
    rate[k, c, r] = ($10 - $11) / ($12 / 1e6)
    p99[k, c, r] = $14 / 1000; p50[k, c, r] = $13 / 1000
    rcpu[k, c, r] = $6 / $5 * 1e6; gcpu[k, c, r] = $7 / $5 * 1e6
    if ($8 != "-") wcalls[k, c, r] = $8 / $5
    if ($17 != "" && $17 != "-") pcpu[k, c, r] = $17 / $5 * 1e6
    bad[k] += $11; errs[k] += $16
  } else {
    so[k] = 1
    rate["so-" k, 0, r] = $10 / ($12 / 1e6)
    # Less what the servers' background work issues in the same time (idle rates).
    secs = $12 / 1e6
    calls["so-" k, 0, r] = max0($8 - idle_calls * secs) / ($10 - 1)
    evals["so-" k, 0, r] = max0($9 - idle_evals * secs) / ($10 - 1)
    gcpu["so-" k, 0, r] = $7 / $10 * 1e6
    p99["so-" k, 0, r] = $14 / 1000
  }
}
END {
  printf "\nwrk -t%d -d%ds, %d buyer(s) cycling, %d round(s), runs alternated; means over the rounds\n", threads, dur, buyers, rounds
  n = split("dropgate base reference", order, " ")
  for (c in seen_c) {
    printf "\n%d connections, every request a winner:\n", c
    for (i = 1; i <= n; i++) {
      k = order[i]
      if (!(k in kinds)) continue
      printf "  %-10s %9.0f claims/s  p50 %6.2f ms  p99 %6.2f ms  Redis CPU %5.2f us/claim  Redis commands %5.2f/claim  server CPU %5.2f us/claim\n",
        k, mean(rate, k, c), mean(p50, k, c), mean(p99, k, c), mean(rcpu, k, c), mean(wcalls, k, c), mean(gcpu, k, c)
      if ((k, c, 1) in pcpu) printf "  %-10s PostgreSQL CPU %5.2f us/claim (the backends of its own database)\n", "", mean(pcpu, k, c)
    }
    ratio_line("claims/s dropgate / reference:", "dropgate", "reference", c)
    if ("base" in kinds) ratio_line("claims/s dropgate / base (this build / BASE_BIN):", "dropgate", "base", c)
    s = 0; m = 0
    for (r = 1; r <= rounds; r++) if (("dropgate", c, r) in rcpu && ("reference", c, r) in rcpu) { s += rcpu["dropgate", c, r] / rcpu["reference", c, r]; m++ }
    if (m) printf "  %-44s %.3f\n", "Redis CPU per claim dropgate / reference:", s / m
    if ("base" in kinds) {
      s = 0; m = 0
      for (r = 1; r <= rounds; r++) if (("base", c, r) in gcpu) { s += gcpu["dropgate", c, r] / gcpu["base", c, r]; m++ }
      if (m) printf "  %-44s %.3f\n", "gateway CPU per claim dropgate / base:", s / m
    }
  }
  for (c in seen_c) if (c + 0 < minc || minc == 0) minc = c + 0
  if (length(so)) {
    printf "\nafter sell-out (a SKU of one unit, %d connections):\n", minc
    split("dropgate nofast reference", o2, " ")
    for (i = 1; i <= 3; i++) {
      k = o2[i]
      if (!(k in so)) continue
      printf "  %-10s %9.0f attempts/s  p99 %6.2f ms  Redis commands %.4f per refused attempt (EVALSHA %.4f; idle rates subtracted)  server CPU %5.2f us/attempt\n",
        (k == "nofast" ? "no-fast" : k), mean(rate, "so-" k, 0), mean(p99, "so-" k, 0), mean(calls, "so-" k, 0),
        mean(evals, "so-" k, 0), mean(gcpu, "so-" k, 0)
    }
    s = 0; m = 0
    for (r = 1; r <= rounds; r++) if (("so-dropgate", 0, r) in rate && ("dropgate", minc, r) in rate) { s += rate["so-dropgate", 0, r] / rate["dropgate", minc, r]; m++ }
    if (m) printf "  %-44s %.2f (target >= 3)\n", "attempts/s after sell-out / winning claims/s:", s / m
    s = 0; m = 0
    for (r = 1; r <= rounds; r++) if (("so-dropgate", 0, r) in rate && ("so-nofast", 0, r) in rate) { s += rate["so-dropgate", 0, r] / rate["so-nofast", 0, r]; m++ }
    if (m) printf "  %-44s %.2f\n", "attempts/s fast path / DROPGATE_SOLD_OUT_TRUST_MS=0:", s / m
  }
  printf "\n(idle Redis while nothing ran: CPU %.4f s/s, %.1f commands/s, %.2f EVALSHA/s)\n", idle, idle_calls, idle_evals
  bad_any = 0
  for (k in bad) if (bad[k] > 0) { printf "WARNING: %s: %d non-2xx answers in runs that should only win\n", k, bad[k]; bad_any = 1 }
  for (k in errs) if (errs[k] > 0) printf "WARNING: %s: %d socket errors\n", k, errs[k]
  exit bad_any
}
