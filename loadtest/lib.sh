# shellcheck shell=bash
# lib.sh: shell helpers shared by ratio.sh and run-scenarios.sh. Source it after setting
# ROOT (the repository) and HERE (loadtest/). Nothing runs on sourcing but the temp dir.
#
# Every process started here runs under `timeout -k 5 $LIFE_S`, so it ends by itself even if
# the script is killed before its trap runs; the trap (cleanup) stops them all at once.

TMP=$(mktemp -d /tmp/dropgate-load.XXXXXX)
PIDS=()     # `timeout` wrappers of every server started
DBS=()      # databases to drop at the end
PREFIXES=() # key prefixes to delete from the shared Redis at the end
SHARED_REDIS_CLI=(redis-cli -h 127.0.0.1 -p 6379)
PG=(psql -h 127.0.0.1 -U postgres -v ON_ERROR_STOP=1 -qAt)

say() { printf '%s %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() {
  say "error: $*"
  exit 2
}

# need_tools CMD...: installs the Debian package of every missing command.
need_tools() {
  local missing=() c pkg
  for c in "$@"; do
    command -v "$c" >/dev/null 2>&1 && continue
    case "$c" in
      redis-cli) pkg=redis-tools ;;
      redis-server) pkg=redis-server ;;
      psql) pkg=postgresql-client ;;
      *) pkg=$c ;;
    esac
    missing+=("$pkg")
  done
  ((${#missing[@]} == 0)) && return 0
  say "installing ${missing[*]}"
  [[ $(id -u) == 0 ]] || die "missing ${missing[*]}; install them (apt-get install -y ${missing[*]})"
  timeout 300 apt-get update -qq >/dev/null || true
  DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq "${missing[@]}" >/dev/null ||
    die "could not install ${missing[*]}"
}

rand_hex() { od -An -N"$1" -tx1 /dev/urandom | tr -d ' \n'; }

target_dir() {
  (cd "$ROOT" && cargo metadata --format-version 1 --no-deps | jq -r .target_directory)
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null && return
  local p
  for _ in $(seq 50); do
    p=$((20000 + RANDOM % 40000))
    ss -ltn | awk '{print $4}' | grep -q ":$p\$" || { echo "$p"; return; }
  done
  die "no free port found"
}

# start_bg LOG CMD...: starts CMD in the background, bounded by LIFE_S; sets BG_PID.
# (Not to be called in $(...): the pid must reach PIDS in this shell.)
start_bg() {
  local log=$1
  shift
  timeout -k 5 "${LIFE_S:?}" "$@" >"$log" 2>&1 &
  BG_PID=$!
  disown "$BG_PID" # no job notices; stop() ends it
  PIDS+=("$BG_PID")
}

# wait_listen PID LOG: the address a server logs as `listening on ADDR` (60 s at most).
wait_listen() {
  local pid=$1 log=$2 addr
  for _ in $(seq 600); do
    addr=$(sed 's/\x1b\[[0-9;]*m//g' "$log" | grep -o 'listening on [0-9.:]*' | head -1 | awk '{print $3}')
    [[ -n $addr ]] && { echo "$addr"; return 0; }
    kill -0 "$pid" 2>/dev/null || { tail -20 "$log" >&2; die "server exited early (log $log)"; }
    sleep 0.1
  done
  tail -20 "$log" >&2
  die "server did not log its address within 60 s (log $log)"
}

# stop PID: TERM the timeout wrapper (which forwards it), then KILL what is left.
stop() {
  local pid=$1 child
  kill -0 "$pid" 2>/dev/null || return 0
  child=$(pgrep -P "$pid" || true)
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 100); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  say "pid $pid did not stop on TERM; killing it"
  for c in $child; do kill -KILL "$c" 2>/dev/null || true; done
  kill -KILL "$pid" 2>/dev/null || true
}

cleanup() {
  local rc=$? pid db prefix
  for pid in "${PIDS[@]}"; do stop "$pid"; done
  for db in "${DBS[@]}"; do
    "${PG[@]}" -d postgres -c "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" >/dev/null 2>&1 || true
  done
  for prefix in "${PREFIXES[@]}"; do
    "${SHARED_REDIS_CLI[@]}" --scan --pattern "$prefix:*" 2>/dev/null |
      xargs -r -n 500 "${SHARED_REDIS_CLI[@]}" DEL >/dev/null 2>&1 || true
  done
  if [[ ${KEEP_TMP:-0} == 1 || $rc != 0 ]]; then
    say "logs kept in $TMP"
  else
    rm -rf "$TMP"
  fi
  exit "$rc"
}

# start_gateway NAME DB PREFIX [VAR=VALUE...]: a fresh gateway on a free loopback port, with
# SECRET and ADMIN as its admission secret and admin token; sets GW_URL (its base URL).
start_gateway() {
  local name=$1 db=$2 prefix=$3 addr
  shift 3
  DBS+=("$db")
  start_bg "$TMP/$name.log" env \
    DROPGATE_ADMISSION_SECRET="$SECRET" DROPGATE_ADMIN_TOKEN="$ADMIN" \
    DROPGATE_LISTEN=127.0.0.1:0 DATABASE_URL="postgres://postgres@127.0.0.1:${PGPORT:-5432}/$db" \
    DROPGATE_KEY_PREFIX="$prefix" REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379}" \
    RUST_LOG="${RUST_LOG:-info}" "$@" "$DROPGATE_BIN" serve
  addr=$(wait_listen "$BG_PID" "$TMP/$name.log")
  # shellcheck disable=SC2034 # read by the sourcing script
  GW_URL="http://$addr"
  # shellcheck disable=SC2034
  GW_PID=$(server_pid "$BG_PID") GW_WRAPPER=$BG_PID
}

# server_pid WRAPPER: the pid of the server a `timeout` wrapper (start_bg) runs.
server_pid() {
  local pid
  for _ in $(seq 50); do
    pid=$(pgrep -P "$1" | head -1) && [[ -n $pid ]] && { echo "$pid"; return; }
    sleep 0.1
  done
  die "no child of $1"
}

# proc_cpu PID: CPU seconds (user + system) the process has used so far.
proc_cpu() {
  awk -v hz="$(getconf CLK_TCK)" '{ sub(/^.*\) /, ""); printf "%.4f", ($12 + $13) / hz }' "/proc/$1/stat"
}

# pg_cpu DB: CPU seconds (user + system) the PostgreSQL backends connected to DB have used so
# far (their process titles name the database). Backends that exit during a run take theirs
# with them; a gateway's pooled connections live for the whole run.
pg_cpu() {
  local hz pid total=0
  hz=$(getconf CLK_TCK)
  for pid in $(pgrep -f "^postgres: .* $1 "); do
    total=$(awk -v t="$total" -v hz="$hz" '{ sub(/^.*\) /, ""); printf "%.4f", t + ($12 + $13) / hz }' "/proc/$pid/stat" 2>/dev/null || echo "$total")
  done
  echo "$total"
}

sub() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.6f", a - b }'; }

# start_private_redis_or_shared PREFIX: a private redis-server on a free port
# (RATIO_REDIS=private, the default), or the shared one with PREFIX* cleaned up at the end.
# Sets RPORT, RCLI, REDIS_URL and IDLE_CPU_PER_S (Redis's CPU rate with everything idle).
start_private_redis_or_shared() {
  if [[ ${RATIO_REDIS:-private} == private ]]; then
    RPORT=$(free_port)
    start_bg "$TMP/redis.log" redis-server --bind 127.0.0.1 --port "$RPORT" --save '' \
      --appendonly no --dir "$TMP" --protected-mode yes
    RCLI=(redis-cli -h 127.0.0.1 -p "$RPORT")
    for _ in $(seq 100); do
      [[ $("${RCLI[@]}" PING 2>/dev/null) == PONG ]] && break
      sleep 0.1
    done
    [[ $("${RCLI[@]}" PING 2>/dev/null) == PONG ]] || die "the private redis-server did not start"
  else
    RPORT=6379
    RCLI=("${SHARED_REDIS_CLI[@]}")
    PREFIXES+=("$1"g "$1"b "$1"n "$1"r "$1")
  fi
  export REDIS_URL=redis://127.0.0.1:$RPORT
}

# Redis's CPU seconds so far (INFO cpu: used_cpu_sys + used_cpu_user).
redis_cpu() {
  "${RCLI[@]}" INFO cpu | tr -d '\r' |
    awk -F: '$1 == "used_cpu_sys" || $1 == "used_cpu_user" { s += $2 } END { printf "%.6f", s }'
}

# redis_calls all|evalsha: commands Redis ran so far (INFO commandstats; scripts' own calls
# included in "all").
redis_calls() {
  "${RCLI[@]}" INFO commandstats | tr -d '\r' | awk -v which="$1" -F'[:=,]' '
    /^cmdstat_/ { if (which == "all" || $1 == "cmdstat_" which) s += $3 }
    END { printf "%d", s }'
}

# wrk_run NAME URL CONNS: one bounded wrk run with the buyers of $TOKENS (WRK_TOKENS);
# sets R_* from its WRK_RESULT line.
wrk_run() {
  local name=$1 url=$2 conns=$3 out=$TMP/$1.wrk line kv
  WRK_TOKENS=${TOKENS:-} WRK_THREADS=$THREADS timeout -k 5 $((DURATION_S + 30)) \
    wrk -t"$THREADS" -c"$conns" -d"${DURATION_S}s" --latency -s "$HERE/wrk/post.lua" "$url" >"$out" 2>&1 ||
    say "wrk $name exited with $?"
  line=$(sed -n 's/^WRK_RESULT //p' "$out")
  [[ -n $line ]] || { cat "$out" >&2; die "wrk $name printed no result"; }
  for kv in $line; do printf -v "R_${kv%%=*}" '%s' "${kv#*=}"; done
}

# record TYPE KIND CONNS ROUND UNITS REDIS_CPU_S GW_CPU_S CALLS EVALSHAS [PG_CPU_S]: one line
# of results (R_* from wrk_run, the rest from the arguments; PG_CPU_S last, "-" when not
# given), echoed readably.
# shellcheck disable=SC2154 # R_* are set by wrk_run through printf -v
record() {
  local errors=$((R_connect + R_read + R_write + R_timeout))
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "${@:1:9}" \
    "$R_requests" "$R_non2xx" "$R_duration_us" "$R_p50_us" "$R_p99_us" "$R_p999_us" "$errors" \
    "${10:--}" >>"$RESULTS"
  awk -F'\t' '{
    rate = $10 / ($12 / 1e6); won = $10 - $11
    printf "%-8s %-9s c%-4s round %s: %9.0f req/s  2xx %d  p50 %6.2f ms  p99 %6.2f ms  redis cpu %.3f s  gateway cpu %.3f s  units %d  socket errors %d\n",
      $1, $2, $3, $4, rate, won, $13 / 1000, $14 / 1000, $6, $7, $5, $16
  }' <<<"$(tail -1 "$RESULTS")" >&2
}

# admin METHOD URL [BODY]: an admin call; prints the body, fails on a transport error.
admin() {
  local method=$1 url=$2 body=${3:-}
  curl -sS -m 10 -X "$method" -H "Authorization: Bearer $ADMIN" \
    ${body:+-H 'Content-Type: application/json' --data "$body"} "$url"
}

# wait_drained URL SKU LIMIT_S: polls the SKU view until in_flight == 0 and consistent;
# prints the last view. Returns 1 if it did not drain within LIMIT_S, 2 if the gateway stopped
# answering (three reads in a row failed).
wait_drained() {
  local url=$1 sku=$2 view deadline=$((SECONDS + $3)) failed=0
  while :; do
    if view=$(admin GET "$url/admin/skus/$sku" 2>/dev/null); then
      failed=0
      if [[ $(jq -r '(.in_flight == 0) and .consistent' <<<"$view" 2>/dev/null) == true ]]; then
        echo "$view"
        return 0
      fi
    else
      failed=$((failed + 1))
      ((failed >= 3)) && return 2
    fi
    if ((SECONDS >= deadline)); then
      echo "$view"
      return 1
    fi
    sleep 0.25
  done
}
