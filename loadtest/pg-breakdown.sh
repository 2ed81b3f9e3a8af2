#!/usr/bin/env bash
# pg-breakdown.sh: where PostgreSQL's CPU per winner goes, statement by statement.
#
#   loadtest/pg-breakdown.sh              # dropgate alone on a private cluster, no events
#   EVENTS=1 loadtest/pg-breakdown.sh     # the same with the relay publishing (a private nats-server)
#
# Starts a private PostgreSQL 15 cluster (initdb as the `postgres` user, a free port) with
# `pg_stat_statements` loaded and autovacuum off like the shared one, then runs
# `ratio.sh` against it (ROUNDS=1 CONNS_LIST=64 SOLD_OUT=0 unless given). Around the ratio run:
# the whole cluster's CPU (cluster-cpu.sh: backends, WAL writer, checkpointer, the exited ones;
# a CHECKPOINT at the end so the run's dirty pages are written inside the span), and
# `pg_stat_statements` reset before and read after. Prints, per statement, its calls, rows and
# execution time per winner (winners: the rows the writer's `INSERT INTO issuances` wrote),
# and the cluster's CPU per winner beside ratio.sh's own column (the gateway's backends only).
# Statement time is wall time inside the executor: on loopback with everything cached it is
# close to CPU, and it leaves out parsing, the protocol and the commit's WAL flush.
#
# The ratio run's gateways poll PostgreSQL while the reference runs too; statements whose calls
# do not grow with winners (the gauges, the relay's idle reads) show as a rate per second.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BIN=/usr/lib/postgresql/15/bin
[[ -x $BIN/initdb ]] || { echo "PostgreSQL 15's server binaries are not in $BIN" >&2; exit 2; }
[[ $(id -u) == 0 ]] || { echo "run as root: the private cluster runs as the postgres user" >&2; exit 2; }

DIR=$(mktemp -d /var/tmp/dropgate-pgstat.XXXXXX)
chown postgres "$DIR"
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
as_pg() { runuser -u postgres -- "$@"; }
finish() {
  as_pg "$BIN/pg_ctl" -D "$DIR/data" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$DIR"
}
trap finish EXIT

as_pg "$BIN/initdb" -D "$DIR/data" -A trust -U postgres >"$DIR/initdb.log" 2>&1
cat >>"$DIR/data/postgresql.conf" <<EOF
port = $PORT
listen_addresses = '127.0.0.1'
unix_socket_directories = '$DIR'
autovacuum = off
shared_buffers = 128MB
max_wal_size = 1GB
shared_preload_libraries = 'pg_stat_statements'
pg_stat_statements.track = all
pg_stat_statements.max = 5000
# Lock waits longer than 5 ms are logged, and counted at the end: execution time is wall time,
# and a statement that waited for a row lock looks slow without using the CPU.
log_lock_waits = on
deadlock_timeout = '5ms'
EOF
as_pg "$BIN/pg_ctl" -D "$DIR/data" -l "$DIR/log" -w start >/dev/null
export PGPORT=$PORT
PSQL=(psql -h 127.0.0.1 -U postgres -X -q -v ON_ERROR_STOP=1)
"${PSQL[@]}" -c 'CREATE EXTENSION pg_stat_statements' >/dev/null
# shellcheck source=cluster-cpu.sh
source "$HERE/cluster-cpu.sh"

if [[ ${EVENTS:-0} == 1 ]]; then
  # A private JetStream server, so the run's stream and its messages go with the run.
  NPORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  timeout -k 5 7200 nats-server -a 127.0.0.1 -p "$NPORT" -js -sd "$DIR/nats" >"$DIR/nats.log" 2>&1 &
  NATS_PID=$!
  trap 'kill $NATS_PID 2>/dev/null || true; finish' EXIT
  for _ in $(seq 50); do
    grep -q 'Server is ready' "$DIR/nats.log" && break
    sleep 0.1
  done
  export DROPGATE_NATS_URL=nats://127.0.0.1:$NPORT
else
  unset DROPGATE_NATS_URL
fi

# The databases' names by oid, kept while ratio.sh runs (it drops them on exit), so the
# statements of each gateway (`_g` dropgate, `_b` BASE_BIN's) are told apart.
"${PSQL[@]}" -c 'CREATE TABLE dbs (oid oid PRIMARY KEY, name text)' >/dev/null
(
  while sleep 1; do
    "${PSQL[@]}" -c "INSERT INTO dbs SELECT oid, datname FROM pg_database ON CONFLICT DO NOTHING" \
      >/dev/null 2>&1 || true
  done
) &
NAMER=$!
"${PSQL[@]}" -c 'SELECT pg_stat_statements_reset()' >/dev/null
c0=$(cluster_cpu) t0=$(date +%s.%N)
ROUNDS=${ROUNDS:-1} CONNS_LIST=${CONNS_LIST:-64} SOLD_OUT=${SOLD_OUT:-0} "$HERE/ratio.sh" \
  2>&1 | tee "$DIR/ratio.out" | grep -v '^[0-9:]* \(wrk\|run\) ' || true
kill "$NAMER" 2>/dev/null || true
"${PSQL[@]}" -c CHECKPOINT
c1=$(cluster_cpu) t1=$(date +%s.%N)

SPAN=$(awk -v a="$t1" -v b="$t0" 'BEGIN { print a - b }')
winners=$("${PSQL[@]}" -At -c "
  SELECT greatest(sum(rows), 1) FROM pg_stat_statements
   WHERE query LIKE 'INSERT INTO issuances%' AND query LIKE '%UNNEST%'")
echo
awk -v c="$(awk -v a="$c1" -v b="$c0" 'BEGIN { print a - b }')" -v s="$SPAN" -v n="$winners" \
  'BEGIN { printf "cluster CPU %.2f s over %.0f s, %d winners written by all gateways: %.2f us per winner (all of PostgreSQL, idle polling included)\n", c, s, n, c * 1e6 / n }'
echo "statements by execution time, per gateway database (us per winner of that gateway; calls per second):"
"${PSQL[@]}" -P pager=off -c "
  WITH s AS (
    SELECT coalesce(d.name, s.dbid::text) AS db, s.*
      FROM pg_stat_statements s LEFT JOIN dbs d ON d.oid = s.dbid
     WHERE s.dbid <> (SELECT oid FROM pg_database WHERE datname = 'postgres')),
  w AS (
    SELECT db, greatest(sum(rows), 1) AS n FROM s
     WHERE query LIKE 'INSERT INTO issuances%' AND query LIKE '%UNNEST%' GROUP BY db),
  r AS (
    SELECT right(s.db, 2) AS gw, w.n AS winners,
           round((s.total_exec_time * 1000 / w.n)::numeric, 3) AS us_per_winner,
           s.calls, round(s.calls / greatest($SPAN, 1)::numeric, 2) AS calls_per_s, s.rows,
           round((s.total_exec_time / greatest(s.calls, 1) * 1000)::numeric, 1) AS us_per_call,
           left(regexp_replace(s.query, '\s+', ' ', 'g'), 100) AS query,
           row_number() OVER (PARTITION BY s.db ORDER BY s.total_exec_time DESC) AS k
      FROM s JOIN w USING (db))
  SELECT gw, winners, us_per_winner, calls, calls_per_s, rows, us_per_call, query
    FROM r WHERE k <= ${TOP:-12} ORDER BY gw, us_per_winner DESC"
waits=$(grep -c 'still waiting for' "$DIR/log" || true)
echo "lock waits over 5 ms: $waits"
grep -A1 'still waiting for' "$DIR/log" | grep -o 'STATEMENT: .\{0,100\}' | sort | uniq -c | sort -rn | head -5 || true
