"""Parking on and off, side by side: the CPU GPT-2 step of plugin_bench.py
under 50 %, 30 % and 25 % of its peak, ``dtr(budget)`` (parking, the default)
against ``dtr(budget, park=False)``, runs taking turns, medians of the steps
after the first. A run that fails records its error.

    OMP_NUM_THREADS=1 MEMSCALE_LIBRARY=build/libmemscale.so HF_HUB_OFFLINE=1 \\
        .venv/bin/python bench/park_ab.py --steps 7
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import torch
from plugin_bench import _gpt2, _gpt2_step, _step_peak

from memscale import dtr


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=7)
    p.add_argument("--fractions", type=float, nargs="*", default=[0.5, 0.3, 0.25])
    p.add_argument("--error-chars", type=int, default=120, help="how much of a failed run's error to print")
    args = p.parse_args()
    torch.set_num_threads(1)
    make, ids = _gpt2()
    step = _gpt2_step(ids)
    peak = _step_peak(make, step)
    runs: list[dict[str, Any]] = [{"name": "plain", "region": None}]
    for f in args.fractions:
        for park in (True, False):
            runs.append({"name": f"{f:.0%} park={park}", "region": dtr(int(peak * f), park=park)})
    for r in runs:
        r.update(model=make(), times=[], losses=[], error=None)
    for i in range(args.steps):
        for r in runs:
            if r["error"] is None:
                try:
                    dt, _, loss = step(r["model"], r["region"], i)
                    r["times"].append(dt)
                    r["losses"].append(loss)
                except Exception as exc:  # noqa: BLE001 - a run records its failure
                    r["error"] = f"step {i}: {type(exc).__name__}: {str(exc)[:args.error_chars]}"
    base = statistics.median(runs[0]["times"][1:])
    print(f"peak {peak} bytes; plain step {base * 1e3:.0f} ms (median of {args.steps - 1})")
    print("| run | step / plain | bitwise | evictions | remats | parked / swaps out | compute overhead | error |")
    print("|---|---:|---|---:|---:|---:|---:|---|")
    for r in runs[1:]:
        s = r["region"].summary()
        ratio = f"{statistics.median(r['times'][1:]) / base:.2f}" if len(r["times"]) > 1 else "-"
        bitwise = all(torch.equal(a, b) for a, b in zip(runs[0]["losses"], r["losses"]))
        print(
            f"| {r['name']} | {ratio} | {'yes' if bitwise else 'NO'} | {s['evictions']} | {s['rematerializations']} "
            f"| {s['parked']} / {s['swaps_out']} | {s['overhead']:.3f} | {r['error'] or ''} |"
        )


if __name__ == "__main__":
    main()
