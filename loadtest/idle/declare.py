#!/usr/bin/env python3
"""The catalog rows and Redis state PUT /admin/skus leaves for new SKUs idle-000000..idle-{N-1},
without the per-request HTTP and lock round trips: the same INSERT into skus, then the same
declare_sku.lua call (mode seed, the row's declare_id, the same terms as Terms::of), then
seeded = true. Usage: fastdeclare.py N REDIS_PORT PREFIX DB SHA"""
import subprocess, sys
n, port, prefix, db, sha = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
psql = ["psql", "-h", "127.0.0.1", "-U", "postgres", db, "-Atq", "-v", "ON_ERROR_STOP=1", "-c"]
subprocess.run(psql + [f"""INSERT INTO skus (sku, total, per_user_limit, hold_seconds, offer_seconds)
  SELECT 'idle-' || lpad(i::text, 6, '0'), 100, 1, CASE WHEN i % 2 = 1 THEN 600 ELSE 0 END, 0
    FROM generate_series(0, {n - 1}) i ON CONFLICT (sku) DO NOTHING"""], check=True)
rows = subprocess.run(psql + ["SELECT sku, declare_id, hold_seconds FROM skus WHERE NOT seeded"],
                      check=True, capture_output=True, text=True).stdout.split()
def resp(*args):
    out = [f"*{len(args)}\r\n"]
    for a in args:
        b = str(a).encode()
        out.append(f"${len(b)}\r\n{str(a)}\r\n")
    return "".join(out)
buf = []
for r in rows:
    sku, declare_id, hold = r.split("|")
    hold_ms = int(hold) * 1000
    offer_ms = hold_ms if hold_ms > 0 else 300_000
    buf.append(resp("EVALSHA", sha, 2, f"{prefix}:{{{sku}}}:state", f"{prefix}:{{{sku}}}:journal",
                    "seed", 100, 1, declare_id, hold_ms, offer_ms, "", ""))
p = subprocess.run(["redis-cli", "-p", port, "--pipe"], input="".join(buf), text=True,
                   capture_output=True)
print(p.stdout.strip().splitlines()[-1] if p.stdout else p.stderr)
subprocess.run(psql + ["UPDATE skus SET seeded = true WHERE NOT seeded"], check=True)
print(f"seeded {len(rows)} SKUs")
