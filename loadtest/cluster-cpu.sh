# shellcheck shell=bash
# cluster-cpu.sh: `cluster_cpu`, the CPU seconds the local PostgreSQL cluster has used so far:
# the postmaster's, its children's, and its exited children's (reaped into its cutime and
# cstime). Other clusters on the machine are not counted. Sourced by outbox-designs.sh and
# relay-cpu.sh; nothing runs on sourcing but finding the postmaster.
_cc_hz=$(getconf CLK_TCK)
_cc_pm=$(head -1 "$(psql -h 127.0.0.1 -U postgres -XAtc 'SHOW data_directory')/postmaster.pid")
cluster_cpu() {
  local total=0 pid
  for pid in $(pgrep -P "$_cc_pm"); do
    total=$(awk -v t="$total" -v hz="$_cc_hz" '{ sub(/^.*\) /, ""); printf "%.4f", t + ($12 + $13) / hz }' "/proc/$pid/stat" 2>/dev/null || echo "$total")
  done
  awk -v t="$total" -v hz="$_cc_hz" '{ sub(/^.*\) /, ""); printf "%.4f", t + ($12 + $13 + $14 + $15) / hz }' "/proc/$_cc_pm/stat"
}

# pgbench_cpu DB SQL DESIGN ROUND TABLE...: one pgbench run of $TXS transactions of the script
# SQL on DB, then a VACUUM of each TABLE and a CHECKPOINT (the work the run left behind);
# prints "DESIGN ROUND rows cpu_s us_per_row wall_s", the cluster's CPU around all of it per
# row ($TXS × $BATCH rows). Uses the caller's TXS, BATCH, TMP and PSQL.
pgbench_cpu() {
  local db=$1 sql=$2 design=$3 round=$4 before start end after t
  shift 4
  local vacuum=()
  for t in "$@"; do vacuum+=(-c "VACUUM $t"); done
  before=$(cluster_cpu)
  start=$(date +%s.%N)
  pgbench -h 127.0.0.1 -U postgres -n -c 1 -t "$TXS" -f "$sql" "$db" >"$TMP/pgbench.log" 2>&1 ||
    { cat "$TMP/pgbench.log" >&2; return 1; }
  "${PSQL[@]}" -d "$db" "${vacuum[@]}" -c "CHECKPOINT"
  end=$(date +%s.%N)
  after=$(cluster_cpu)
  awk -v d="$design" -v r="$round" -v n="$((TXS * BATCH))" -v a="$after" -v b="$before" -v s="$start" -v e="$end" \
    'BEGIN { printf "%s %d %d %.3f %.2f %.2f\n", d, r, n, a - b, (a - b) * 1e6 / n, e - s }'
}
