#!/usr/bin/env bash
# The claim script's instruction counts (benches/script_cost.rs under callgrind, inside EVALSHA
# only, no wall times: about 70 s) written as JSON to $1, the file tools/benchgate reads.
# The bench runs as the test profile's binary: the counts are Redis's own instructions, the
# same whichever profile built the client, and CI has just built it (`cargo test --benches`).
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:?usage: benches/baselines/run.sh OUT.json}"
SCRIPT_COST_MODES=script SCRIPT_COST_TIMED=0 SCRIPT_COST_JSON="$out" \
  cargo test -q --bench script_cost -- --bench 2>&1 | grep -v '^sending command'
