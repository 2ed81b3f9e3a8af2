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
