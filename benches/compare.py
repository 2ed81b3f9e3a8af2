#!/usr/bin/env python3
"""Save and compare criterion baselines of dropgate's benches (stdlib only).

    python3 benches/compare.py save NAME [CRITERION_ARGS...]
        cargo bench --bench claim_path --bench writer -- --save-baseline NAME [CRITERION_ARGS...]

    python3 benches/compare.py compare NAME [--threshold PCT] [--no-run] [CRITERION_ARGS...]
        cargo bench --bench claim_path --bench writer -- --baseline NAME [CRITERION_ARGS...]
        then prints, per bench run: baseline mean, new mean, change %, and throughput when the
        bench declares one. Exits 1 when any bench's mean grew by more than PCT percent
        (default 10), 2 when there is nothing to compare.

    python3 benches/compare.py show NAME
        prints the table from the files already on disk, without running anything.

CRITERION_ARGS go to the bench binaries, e.g. a filter (`claim_script`) or
`--measurement-time 10`. `--bench NAME` (repeatable) replaces the default set of bench targets.

Criterion writes <dir>/<group>/<function>[/<value>]/{new,<baseline>}/{estimates,benchmark}.json
under $CRITERION_HOME, else $CARGO_TARGET_DIR/criterion, else
/var/tmp/dropgate-target/criterion (the target dir of .cargo/config.toml).
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_TARGET_DIR = "/var/tmp/dropgate-target"
DEFAULT_BENCHES = ["claim_path", "writer"]
REPO = Path(__file__).resolve().parent.parent


def criterion_dir() -> Path:
    if os.environ.get("CRITERION_HOME"):
        return Path(os.environ["CRITERION_HOME"])
    return Path(os.environ.get("CARGO_TARGET_DIR", DEFAULT_TARGET_DIR)) / "criterion"


def run_cargo(benches, criterion_args) -> int:
    cmd = ["cargo", "bench"]
    for b in benches:
        cmd += ["--bench", b]
    cmd += ["--"] + criterion_args
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    env = dict(os.environ)
    # Keep criterion's output where this script reads it.
    env.setdefault("CARGO_TARGET_DIR", os.environ.get("CARGO_TARGET_DIR", DEFAULT_TARGET_DIR))
    return subprocess.call(cmd, cwd=REPO, env=env)


def load_json(path: Path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def collect(root: Path, baseline: str, since: float):
    """One row per bench whose `new` result exists (and was written after `since`)."""
    rows = []
    for new_est in sorted(root.rglob("new/estimates.json")):
        bench_dir = new_est.parent.parent
        if since and new_est.stat().st_mtime < since:
            continue
        meta = load_json(bench_dir / "new" / "benchmark.json") or {}
        new = load_json(new_est)
        base = load_json(bench_dir / baseline / "estimates.json")
        if new is None:
            continue
        rows.append(
            {
                "id": meta.get("full_id") or str(bench_dir.relative_to(root)),
                "new_ns": new["mean"]["point_estimate"],
                "base_ns": base["mean"]["point_estimate"] if base else None,
                "elements": elements(meta.get("throughput")),
            }
        )
    rows.sort(key=lambda r: natural_key(r["id"]))
    return rows


def natural_key(bench_id):
    """`claim_script/8` before `claim_script/32`."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", bench_id)]


def elements(throughput):
    """Items per iteration, or None. Criterion serialises e.g. {"Elements": 64}."""
    if not isinstance(throughput, dict):
        return None
    for kind in ("Elements", "ElementsAndBytes"):
        v = throughput.get(kind)
        if isinstance(v, int):
            return v
        if isinstance(v, dict) and isinstance(v.get("elements"), int):
            return v["elements"]
    return None


def fmt_time(ns):
    if ns is None:
        return "-"
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.3f} {unit}"
    return f"{ns:.2f} ns"


def fmt_rate(per_sec):
    if per_sec is None:
        return "-"
    for unit, scale in (("M", 1e6), ("K", 1e3)):
        if per_sec >= scale:
            return f"{per_sec / scale:.2f}{unit}/s"
    return f"{per_sec:.1f}/s"


def rate(elems, ns):
    if elems is None or not ns:
        return None
    return elems / (ns / 1e9)


def report(rows, baseline, threshold) -> int:
    if not rows:
        print(f"no criterion results found under {criterion_dir()}", file=sys.stderr)
        return 2
    header = ("bench", f"{baseline} mean", "new mean", "change", f"{baseline} thrpt", "new thrpt", "verdict")
    table = []
    regressed = []
    compared = 0
    for r in rows:
        change = None
        if r["base_ns"]:
            compared += 1
            change = (r["new_ns"] - r["base_ns"]) / r["base_ns"] * 100.0
        flag = "ok"
        if change is not None and change > threshold:
            flag = "REGRESSED"
            regressed.append(r["id"])
        elif change is not None and change < -threshold:
            flag = "improved"
        elif change is None:
            flag = "no baseline"
        table.append(
            (
                r["id"],
                fmt_time(r["base_ns"]),
                fmt_time(r["new_ns"]),
                "-" if change is None else f"{change:+.1f}%",
                fmt_rate(rate(r["elements"], r["base_ns"])),
                fmt_rate(rate(r["elements"], r["new_ns"])),
                flag,
            )
        )
    widths = [max(len(str(row[i])) for row in [header] + table) for i in range(len(header))]
    for i, row in enumerate([header] + table):
        cells = [str(c).ljust(w) if j == 0 else str(c).rjust(w) for j, (c, w) in enumerate(zip(row, widths))]
        print("  ".join(cells).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths).rstrip())
    print()
    if compared == 0:
        print(f"no bench has a baseline named {baseline!r}", file=sys.stderr)
        return 2
    if regressed:
        print(f"{len(regressed)} bench(es) slower than {baseline!r} by more than {threshold}%:", file=sys.stderr)
        for r in regressed:
            print(f"  {r}", file=sys.stderr)
        return 1
    print(f"no bench slower than {baseline!r} by more than {threshold}%")
    return 0


def main(argv) -> int:
    p = argparse.ArgumentParser(
        description="Save or compare criterion baselines of the dropgate benches.",
        epilog="Unrecognised arguments are passed to the bench binaries (criterion).",
    )
    p.add_argument("command", choices=["save", "compare", "show"])
    p.add_argument("name", help="baseline name")
    p.add_argument("--threshold", type=float, default=10.0, help="regression threshold in percent (default 10)")
    p.add_argument("--no-run", action="store_true", help="compare: only read the results already on disk")
    p.add_argument("--bench", action="append", dest="benches", help="bench target (repeatable); default: claim_path, writer")
    args, passthrough = p.parse_known_args(argv)
    if passthrough[:1] == ["--"]:
        passthrough = passthrough[1:]
    benches = args.benches or DEFAULT_BENCHES

    if args.command == "save":
        return run_cargo(benches, ["--save-baseline", args.name] + passthrough)

    since = 0.0
    if args.command == "compare" and not args.no_run:
        since = time.time() - 1.0
        rc = run_cargo(benches, ["--baseline", args.name] + passthrough)
        if rc != 0:
            print(f"cargo bench failed with exit code {rc}", file=sys.stderr)
            return rc
    return report(collect(criterion_dir(), args.name, since), args.name, args.threshold)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
