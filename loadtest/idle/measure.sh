#!/bin/sh
# measure.sh GATEWAY_PID REDIS_PORT SECONDS: Redis commands/s and CPU (gateway, redis-server)
# over SECONDS of an idle gateway, then the commands/s per command. CPU from /proc/<pid>/stat
# utime+stime (clock ticks, 100/s). How docs/active-set.md's figures were measured:
#   redis-server --port 6391 --save "" &            # a Redis of its own: INFO counts all
#   createdb -h 127.0.0.1 -U postgres dg_idle_measure
#   dropgate serve (REDIS_URL=redis://127.0.0.1:6391, DATABASE_URL=.../dg_idle_measure,
#     DROPGATE_KEY_PREFIX=idle): it loads the scripts and migrates
#   loadtest/idle/declare.py 100000 6391 idle dg_idle_measure "$(sha1sum lua/declare_sku.lua | cut -c1-40)"
#   loadtest/idle/measure.sh <gateway pid> 6391 30
set -eu
GW=$1; PORT=$2; D=${3:-20}
HERE=$(cd "$(dirname "$0")" && pwd)
T=$(mktemp -d)
RS=$(redis-cli -p "$PORT" INFO server | awk -F: '/^process_id/{print $2}' | tr -d '\r')
cmds() { redis-cli -p "$PORT" INFO stats | awk -F: '/^total_commands_processed/{print $2}' | tr -d '\r'; }
cpu() { awk '{print $14+$15}' "/proc/$1/stat"; }
redis-cli -p "$PORT" INFO commandstats | tr -d '\r' | grep cmdstat >"$T/cs0"
c0=$(cmds); g0=$(cpu "$GW"); r0=$(cpu "$RS")
sleep "$D"
c1=$(cmds); g1=$(cpu "$GW"); r1=$(cpu "$RS")
redis-cli -p "$PORT" INFO commandstats | tr -d '\r' | grep cmdstat >"$T/cs1"
echo "over $D s: redis commands/s $(((c1 - c0) / D)); gateway CPU $(((g1 - g0) / D))% of a core; redis-server CPU $(((r1 - r0) / D))% of a core"
python3 "$HERE/csdiff.py" "$T/cs0" "$T/cs1" "$D" | head -8
rm -rf "$T"
