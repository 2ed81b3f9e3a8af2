#!/usr/bin/env bash
# A long soak of the model-based tests: each round draws a fresh seed and runs the script-level
# model (MODEL_STEPS, default 1,000,000) and the gateway under the nemesis (GATEWAY_MODEL_STEPS,
# default 50,000), whose long PostgreSQL outage (a LOCK TABLE held, or the server unreachable)
# lasts GATEWAY_MODEL_PG_OUTAGE_MS (default 60,000 here; CI's default run uses 4,000).
# GATEWAY_MODEL_SKIP (comma-separated operation and fault names, docs/testing.md) leaves parts
# out. A failing round keeps its log and prints its seed (a passing one keeps it too when the
# model's monitor printed an unbalanced reading); replay it with
#   MODEL_SEED=<seed> GATEWAY_MODEL_STEPS=<steps> cargo test --test api model::
# Usage: tests/soak.sh [hours]   (default 4)
set -uo pipefail
cd "$(dirname "$0")/.."
hours="${1:-4}"
deadline=$(( $(date +%s) + hours * 3600 ))
logs="${SOAK_LOGS:-/var/tmp/dropgate-soak}"
mkdir -p "$logs"
export MODEL_STEPS="${MODEL_STEPS:-1000000}" GATEWAY_MODEL_STEPS="${GATEWAY_MODEL_STEPS:-50000}"
export GATEWAY_MODEL_PG_OUTAGE_MS="${GATEWAY_MODEL_PG_OUTAGE_MS:-60000}"
export GATEWAY_MODEL_SKIP="${GATEWAY_MODEL_SKIP:-}"
cargo test --test api --no-run -q
round=0; failed=0
while [ "$(date +%s)" -lt "$deadline" ]; do
  round=$((round + 1))
  seed=$(od -An -N8 -tu8 /dev/urandom | tr -d ' ')
  log="$logs/round-$round-$seed.log"
  if MODEL_SEED="$seed" cargo test --test api -q model:: -- --nocapture >"$log" 2>&1; then
    readings=$(grep -c '^monitor' "$log")
    echo "round $round seed $seed: ok; $(grep -ho 'GATEWAY_MODEL_STEPS=[0-9]*\|[0-9]* steps in [^;]*' "$log" | tr '\n' ' ')monitor lines: $readings"
    # A passing round's log goes, unless the monitor printed a reading to explain.
    [ "$readings" -gt 0 ] || rm -f "$log"
  else
    failed=$((failed + 1))
    echo "round $round seed $seed: FAILED (log: $log)"
  fi
done
echo "soak: $round rounds, $failed failed"
[ "$failed" -eq 0 ]
