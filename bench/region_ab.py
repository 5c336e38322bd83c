#!/usr/bin/env python3
"""Per-op cost of the DTR region, two checkouts side by side, in CPU time.

Runs the loop of ``bench/plugin_bench.py``'s per-op part (``y = y + 1``,
``y = y * 0.5`` on a 16x16 tensor) plainly, under an empty ``TorchDispatchMode``,
in ``dtr(None)`` and in ``dtr(1 TiB)``, in one child process per checkout (its own
package and ``build/libmemscale.so``), checkouts A and B in turns; prints the
medians over rounds of each child's medians (CPU time of the process: on the
shared development machine other jobs swamp wall time). Works on checkouts
whose ``plugin_bench.py`` predates the empty-mode variant.

    .venv/bin/python bench/region_ab.py --a /tmp/before --b . --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def child(ops: int, reps: int) -> dict[str, float]:
    """One process's medians (us per op), variants in turns."""
    from memscale import dtr  # the checkout's package (PYTHONPATH), before plugin_bench adds this tree's

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from plugin_bench import EmptyMode, op_loop  # the harness only: the loop and the empty mode

    loop = op_loop(ops)

    def under(ctx: Any) -> Any:
        def run() -> None:
            with ctx():
                loop()

        return run

    free, roomy = dtr(None), dtr(1 << 40)
    runs = {"plain": loop, "empty mode": under(EmptyMode), "dtr(None)": under(lambda: free), "dtr(1 TiB)": under(lambda: roomy)}
    times: dict[str, list[float]] = {k: [] for k in runs}
    for fn in runs.values():
        fn()
    for _ in range(reps):
        for name, fn in runs.items():
            t0 = time.process_time_ns()
            fn()
            times[name].append((time.process_time_ns() - t0) / (2 * ops) / 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--a", type=Path, help="checkout A (before)")
    p.add_argument("--b", type=Path, help="checkout B (after)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--ops", type=int, default=1000)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.ops, args.reps)))
        return 0
    trees = {"A": args.a.resolve(), "B": args.b.resolve()}
    got: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
    for _ in range(args.rounds):
        for side, tree in trees.items():
            env = dict(os.environ, PYTHONPATH=str(tree / "pytorch_plugin"), MEMSCALE_LIBRARY=str(tree / "build" / "libmemscale.so"))
            out = subprocess.run(
                [sys.executable, __file__, "--child", "--ops", str(args.ops), "--reps", str(args.reps)],
                env=env, capture_output=True, text=True, check=True,
            ).stdout
            got[side].append(json.loads(out.strip().splitlines()[-1]))
    print(f"A = {trees['A']}, B = {trees['B']}; {args.rounds} rounds; load average {os.getloadavg()[0]:.1f} at the end")
    print("| us per op (ratio to the empty mode) | A (before) | B (after) | B / A |\n|---|---:|---:|---:|")
    med = {s: {k: statistics.median(r[k] for r in rows) for k in rows[0]} for s, rows in got.items()}
    for k in med["A"]:
        a, b = med["A"][k], med["B"][k]
        ea, eb = med["A"]["empty mode"], med["B"]["empty mode"]
        print(f"| {k} | {a:.2f} ({a / ea:.2f}x) | {b:.2f} ({b / eb:.2f}x) | {b / a:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
