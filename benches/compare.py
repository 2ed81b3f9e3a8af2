#!/usr/bin/env python3
"""Save and compare baselines of dropgate's benches: criterion's wall times and callgrind's
instruction counts (stdlib only).

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

Instruction counts (benches/instructions.rs, gungraun under callgrind) run with `save` and
`compare` unless `--no-instructions` (or when the `gungraun-runner` binary is missing: then a
warning). They are exact, so their threshold is tight: `--ir-threshold PCT` (default 2).
`save NAME` keeps them in <target>/instructions/NAME.json; `compare NAME` flags any bench
whose instruction count grew by more than PCT percent. Every run that measured anything also
appends one JSON line to the history file (`--history`, default <target>/bench-history.jsonl):
{"time", "commit", "command", "baseline", "criterion": {id: mean_ns}, "instructions":
{id: Ir}}, the series a benchmark CI plots.

Criterion writes <dir>/<group>/<function>[/<value>]/{new,<baseline>}/{estimates,benchmark}.json
under $CRITERION_HOME, else $CARGO_TARGET_DIR/criterion, else
/var/tmp/dropgate-target/criterion (the target dir of .cargo/config.toml).
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_TARGET_DIR = "/var/tmp/dropgate-target"
DEFAULT_BENCHES = ["claim_path", "writer"]
INSTRUCTIONS_BENCH = "instructions"
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


def target_dir() -> Path:
    return Path(os.environ.get("CARGO_TARGET_DIR", DEFAULT_TARGET_DIR))


def run_instructions(extra_args):
    """Runs the callgrind benches; returns {bench id: instruction count}, or None when they
    could not run."""
    if not shutil.which("gungraun-runner"):
        print(
            "warning: gungraun-runner not installed; instruction counts skipped "
            "(cargo install gungraun-runner --version 0.20.0)",
            file=sys.stderr,
        )
        return None
    cmd = ["cargo", "bench", "--bench", INSTRUCTIONS_BENCH, "--", "--output-format=json"] + extra_args
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    env = dict(os.environ)
    env.setdefault("CARGO_TARGET_DIR", str(target_dir()))
    proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        print(f"instruction benches failed with exit code {proc.returncode}", file=sys.stderr)
        return None
    return parse_gungraun(proc.stdout)


def parse_gungraun(text):
    """{id: Ir} from gungraun's `--output-format=json` (one summary object per line, or an
    array). The id is `group::function.bench_id`."""
    out = {}
    summaries = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] not in "[{":
            continue
        try:
            v = json.loads(line)
        except ValueError:
            continue
        summaries.extend(v if isinstance(v, list) else [v])
    for s in summaries:
        if not isinstance(s, dict) or "profiles" not in s:
            continue
        bench_id = f"{s.get('group', '?')}::{s.get('function_name', '?')}"
        if s.get("id"):
            bench_id += f".{s['id']}"
        ir = find_ir(s["profiles"])
        if ir is not None:
            out[bench_id] = ir
    return out


def find_ir(node):
    """The new (left-hand) value of the first `Ir` metric under a profile's total."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "Ir":
                n = first_int(value)
                if n is not None:
                    return n
        for key in ("total", "data", "metrics", "summary"):
            if key in node:
                n = find_ir(node[key])
                if n is not None:
                    return n
        for value in node.values():
            n = find_ir(value)
            if n is not None:
                return n
    elif isinstance(node, list):
        for value in node:
            n = find_ir(value)
            if n is not None:
                return n
    return None


def first_int(node):
    if isinstance(node, bool):
        return None
    if isinstance(node, (int, float)):
        return int(node)
    if isinstance(node, dict):
        for key in ("Int", "Float", "Left", "Both", "metrics", "new"):
            if key in node:
                return first_int(node[key])
        for value in node.values():
            n = first_int(value)
            if n is not None:
                return n
    if isinstance(node, list) and node:
        return first_int(node[0])
    return None


def instructions_file(name: str) -> Path:
    return target_dir() / "instructions" / f"{name}.json"


def report_instructions(new, name, threshold) -> int:
    """Prints each bench's instruction count against baseline `name`; 1 on a regression."""
    base = load_json(instructions_file(name)) or {}
    header = ("instructions", f"{name} Ir", "new Ir", "change", "verdict")
    table, regressed = [], []
    for bench_id in sorted(new, key=natural_key):
        b, n = base.get(bench_id), new[bench_id]
        change = (n - b) / b * 100.0 if b else None
        flag = "no baseline" if change is None else "ok"
        if change is not None and change > threshold:
            flag = "REGRESSED"
            regressed.append(bench_id)
        elif change is not None and change < -threshold:
            flag = "improved"
        table.append((bench_id, "-" if b is None else str(b), str(n), "-" if change is None else f"{change:+.2f}%", flag))
    print_table(header, table)
    if regressed:
        print(f"{len(regressed)} bench(es) above {name!r} by more than {threshold}% instructions:", file=sys.stderr)
        for r in regressed:
            print(f"  {r}", file=sys.stderr)
        return 1
    if base:
        print(f"no bench above {name!r} by more than {threshold}% instructions")
    return 0


def append_history(path, command, name, rows, instructions):
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, stdout=subprocess.PIPE, text=True
    ).stdout.strip()
    line = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": commit,
        "command": command,
        "baseline": name,
        "criterion": {r["id"]: r["new_ns"] for r in rows},
        "instructions": instructions or {},
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(line, sort_keys=True) + "\n")
    print(f"appended this run to {path}", file=sys.stderr)


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


def print_table(header, table):
    widths = [max(len(str(row[i])) for row in [header] + table) for i in range(len(header))]
    for i, row in enumerate([header] + table):
        cells = [str(c).ljust(w) if j == 0 else str(c).rjust(w) for j, (c, w) in enumerate(zip(row, widths))]
        print("  ".join(cells).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths).rstrip())
    print()


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
    print_table(header, table)
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
    p.add_argument("--threshold", type=float, default=10.0, help="wall-time regression threshold in percent (default 10)")
    p.add_argument("--ir-threshold", type=float, default=2.0, help="instruction-count regression threshold in percent (default 2)")
    p.add_argument("--no-instructions", action="store_true", help="skip the callgrind benches")
    p.add_argument("--no-criterion", action="store_true", help="only the callgrind benches")
    p.add_argument("--history", default=None, help="JSON-lines file each run is appended to (default <target>/bench-history.jsonl)")
    p.add_argument("--no-run", action="store_true", help="compare: only read the results already on disk")
    p.add_argument("--bench", action="append", dest="benches", help="bench target (repeatable); default: claim_path, writer")
    args, passthrough = p.parse_known_args(argv)
    if passthrough[:1] == ["--"]:
        passthrough = passthrough[1:]
    benches = args.benches or DEFAULT_BENCHES

    history = args.history or str(target_dir() / "bench-history.jsonl")
    instructions = None
    if args.command in ("save", "compare") and not args.no_instructions and not args.no_run:
        instructions = run_instructions([])
    if args.command == "save":
        rc = 0
        if not args.no_criterion:
            rc = run_cargo(benches, ["--save-baseline", args.name] + passthrough)
        if instructions:
            instructions_file(args.name).parent.mkdir(parents=True, exist_ok=True)
            with open(instructions_file(args.name), "w", encoding="utf-8") as f:
                json.dump(instructions, f, indent=1, sort_keys=True)
            print(f"saved {len(instructions)} instruction counts as {args.name!r}", file=sys.stderr)
        rows = [] if args.no_criterion else collect(criterion_dir(), args.name, 0)
        append_history(history, "save", args.name, rows, instructions)
        return rc

    since = 0.0
    rc_ir = 0
    if instructions:
        rc_ir = report_instructions(instructions, args.name, args.ir_threshold)
    elif args.command == "show":
        saved = load_json(instructions_file(args.name))
        if saved:
            rc_ir = report_instructions(saved, args.name, args.ir_threshold)
    if args.no_criterion:
        if instructions:
            append_history(history, args.command, args.name, [], instructions)
        return rc_ir
    if args.command == "compare" and not args.no_run:
        since = time.time() - 1.0
        rc = run_cargo(benches, ["--baseline", args.name] + passthrough)
        if rc != 0:
            print(f"cargo bench failed with exit code {rc}", file=sys.stderr)
            return rc
    rows = collect(criterion_dir(), args.name, since)
    rc = report(rows, args.name, args.threshold)
    if args.command == "compare" and not args.no_run:
        append_history(history, "compare", args.name, rows, instructions)
    return max(rc, rc_ir)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
