#!/usr/bin/env bash
# Move the baseline on purpose: measure the claim script's instruction counts on this checkout
# and make them benches/baselines/script_cost.json, with the reason kept in the file. Commit the
# result with the change that moved the cost (benches/baselines/README.md).
#   benches/baselines/save.sh "claim.lua: the journal entry written once (issue 57)"
set -euo pipefail
cd "$(dirname "$0")/../.."
reason="${1:?usage: benches/baselines/save.sh \"why the cost moved\"}"
out="$(mktemp --suffix=.json)"
trap 'rm -f "$out"' EXIT
bash benches/baselines/run.sh "$out"
cargo run -q -p benchgate -- save --current "$out" --reason "$reason"
git --no-pager diff --stat -- benches/baselines/script_cost.json
