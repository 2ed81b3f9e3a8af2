import sys, re
# csdiff.py BEFORE AFTER SECONDS: commands/s per command between two INFO commandstats dumps.
def load(p):
    d = {}
    for line in open(p):
        m = re.match(r'cmdstat_(\S+?):calls=(\d+)', line)
        if m: d[m.group(1)] = int(m.group(2))
    return d
a, b, secs = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3])
rows = sorted(((b[k] - a.get(k, 0)) / secs, k) for k in b)
for r, k in reversed(rows):
    if r > 0: print(f"  {k:12s} {r:10.1f}/s")
