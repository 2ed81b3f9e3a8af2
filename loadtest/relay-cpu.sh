#!/usr/bin/env bash
# relay-cpu.sh: PostgreSQL's CPU per winner with events on, for two builds of the outbox relay
# bench side by side (benches/outbox_relay.rs: a peak-rate drop of UNITS winners, then a
# backlog of BACKLOG winners drained after NATS comes back; every event relayed to JetStream).
#
#   loadtest/relay-cpu.sh BENCH_A BENCH_B     # the bench binaries of two builds
#
# (`cargo bench --bench outbox_relay --no-run` prints where each build put its binary.) Per
# round, A then B: the CPU of the whole local PostgreSQL cluster (the postmaster, its children,
# and the exited children reaped into its cutime/cstime) around the bench, divided by the
# winners (UNITS + BACKLOG); and the bench's own lines (claims/s, events/s, lag). ROUNDS (2).
# Run it on a quiet machine: the cluster's CPU includes every database's.
set -euo pipefail

ROUNDS=${ROUNDS:-2}
export UNITS=${UNITS:-20000} BACKLOG=${BACKLOG:-20000}
# shellcheck source=cluster-cpu.sh
source "$(dirname "${BASH_SOURCE[0]}")/cluster-cpu.sh"

for round in $(seq "$ROUNDS"); do
  for side in A B; do
    bin=$1
    [[ $side == B ]] && bin=$2
    psql -h 127.0.0.1 -U postgres -Xqc CHECKPOINT
    before=$(cluster_cpu)
    out=$("$bin" --bench 2>/dev/null | grep -v '^$' || true)
    psql -h 127.0.0.1 -U postgres -Xqc CHECKPOINT
    after=$(cluster_cpu)
    awk -v s="$side" -v r="$round" -v n="$((UNITS + BACKLOG))" -v a="$after" -v b="$before" \
      'BEGIN { printf "%s round %d: postgres %.2f s for %d winners = %.1f us per winner\n", s, r, a - b, n, (a - b) * 1e6 / n }'
    echo "$out" | sed 's/^/    /'
  done
done
