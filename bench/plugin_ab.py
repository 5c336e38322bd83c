#!/usr/bin/env python3
"""Before/after comparison of the DTR region's cost: two checkouts, side by side.

Runs ``bench/plugin_bench.py --part overhead`` of checkout A and of checkout B in
turns (A B A B ...), each with its own ``build/libmemscale.so`` and its own Python
package, so load changes on a shared machine hit both alike, and prints the
median over rounds of each number: per-op cost (plain, unbudgeted, budgeted) and
the GPT-2 step's ratio to plain and compute overhead at 100/50/30 % of its peak.

Usage (each checkout built with ``make lib``; the test environment's Python):

    git worktree add /tmp/before <commit> && make -C /tmp/before lib
    .venv/bin/python bench/plugin_ab.py --a /tmp/before --b . --rounds 3

Prints a Markdown table; ``--markdown FILE`` appends it to FILE.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

_PER_OP = re.compile(
    r"plain ([\d.]+) us, unbudgeted region ([\d.]+) us .*budgeted, no eviction ([\d.]+) us"
)
# The GPT-2 rows of either version of the table (with or without the "ratio -
# overhead" column before "losses bitwise").
_ROW = re.compile(
    r"^\| (100%|50%|30%) \|[^|]*\|\s*([\d.]+)\s*\|\s*([\d.]+)\s*\|[^|]*\|[^|]*\|[^|]*\|\s*([\d.]+)\s*\|"
    r"(?:\s*[+-][\d.]+\s*\|)?\s*(\w+)"
)


def run_once(tree: Path, steps: int) -> dict[str, float]:
    """One ``plugin_bench.py --part overhead`` run of ``tree``; its numbers."""
    env = dict(os.environ, MEMSCALE_LIBRARY=str(tree / "build" / "libmemscale.so"), HF_HUB_OFFLINE="1")
    env.pop("PYTHONPATH", None)
    out = subprocess.run(
        [sys.executable, str(tree / "bench" / "plugin_bench.py"), "--part", "overhead", "--steps", str(steps)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    got: dict[str, float] = {}
    m = _PER_OP.search(out)
    if m is None:
        raise RuntimeError(f"{tree}: no per-op line in:\n{out}")
    got["plain us/op"], got["dtr(None) us/op"], got["budgeted us/op"] = (float(x) for x in m.groups())
    for line in out.splitlines():
        row = _ROW.match(line)
        if row:
            name, _, ratio, overhead, bitwise = row.groups()
            got[f"GPT-2 {name} step ratio"] = float(ratio)
            got[f"GPT-2 {name} compute overhead"] = float(overhead)
            if bitwise != "yes":
                raise RuntimeError(f"{tree}: losses not bitwise at {name}")
    return got


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--a", required=True, type=Path, help="checkout A (before)")
    p.add_argument("--b", required=True, type=Path, help="checkout B (after)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=7, help="GPT-2 steps per run")
    p.add_argument("--markdown", type=Path, help="append the table to this file")
    args = p.parse_args()
    trees = {"A": args.a.resolve(), "B": args.b.resolve()}
    results: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
    t0 = time.perf_counter()
    for i in range(args.rounds):
        for side, tree in trees.items():
            results[side].append(run_once(tree, args.steps))
            print(f"round {i + 1} {side} done ({time.perf_counter() - t0:.0f} s): {results[side][-1]}", file=sys.stderr)
    keys = [key for key in results["A"][0] if all(key in r for r in results["A"] + results["B"])]
    lines = [
        f"A = {trees['A']}, B = {trees['B']}; {args.rounds} rounds, A and B in turns, medians; "
        f"load average {os.getloadavg()[0]:.1f} at the end.",
        "",
        "| measure | A (before) | B (after) | B / A |",
        "|---|---:|---:|---:|",
    ]
    for key in keys:
        a = statistics.median(r[key] for r in results["A"])
        b = statistics.median(r[key] for r in results["B"])
        lines.append(f"| {key} | {a:.3f} | {b:.3f} | {b / a:.3f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        with args.markdown.open("a") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
