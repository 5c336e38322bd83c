#!/usr/bin/env python3
"""The model-family zoo under DTR budgets: bitwise equality, evictions and step time.

For each family of ``pytorch_plugin/tests/zoo.py`` (random weights, no downloads):
a ``memscale.dtr(None)`` run of three steps gives the step's peak (and the
engine's ``min_budget`` where it reports one); then, for the unbudgeted region
and for each fraction of the peak (or ``1.1 * min_budget`` where that is
higher, as in ``test_zoo.py``), a plain copy and a region copy of the model
train three steps side by side (plain step, region step, interleaved; SGD
after each step; same seeds). A row: bitwise equality of every loss, gradient
and buffer, the region's evictions and rematerializations, its peak usage
against the budget, and the region's median step time over the plain run's.
A row whose run raised records the error's first line. For a family with a
failing row, the lowest budget that works is bisected (op costs fixed at 1 us,
as in the tests) between its ``min_budget`` and its peak.

    MEMSCALE_LIBRARY=build/libmemscale.so HF_HUB_OFFLINE=1 \\
        .venv/bin/python bench/zoo_bench.py --markdown bench/results/zoo.md
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pytorch_plugin"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pytorch_plugin" / "tests"))

import pytest
import torch
import zoo
from _helpers import steady_clock
from memscale import dtr
from memscale.config import format_bytes


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def run_pair(z: zoo.ZooModel, budget: int | None, steps: int) -> dict[str, Any]:
    """Plain and region copies of ``z``, ``steps`` steps interleaved."""
    plain, dtr_run = zoo.Trainer.of(z), zoo.Trainer.of(z)
    region = dtr(budget)
    ref: list[dict[str, Any]] = []
    got: list[dict[str, Any]] = []
    row: dict[str, Any] = {"error": None}
    try:
        for _ in range(steps):
            ref.append(plain.step())
            got.append(dtr_run.step(region))
    except Exception as exc:  # noqa: BLE001 - a row records any failure
        row["error"] = zoo.first_line(exc)
        row["failed_step"] = len(got)
    s = region.summary()
    row.update(
        summary=s,
        diffs=zoo.differences(ref[: len(got)], got) if got else [],
        plain_ms=statistics.median(r["time"] for r in ref) * 1e3 if ref else None,
        region_ms=statistics.median(r["time"] for r in got) * 1e3 if got else None,
        steps_done=len(got),
    )
    return row


def _works(z: zoo.ZooModel, ref: list[dict[str, Any]], budget: int, steps: int) -> bool:
    """Whether ``steps`` region steps at ``budget`` run, bitwise, within it."""
    region = dtr(budget)
    try:
        got = zoo.train(z, region, steps)
    except Exception:  # noqa: BLE001 - a failed budget is an answer
        return False
    return not zoo.differences(ref, got) and region.summary()["peak_usage"] <= budget


def reach(z: zoo.ZooModel, failed: int, passed: int, steps: int, resolution: int) -> int:
    """The lowest budget that works, to ``resolution`` bytes, bisecting
    between a budget that cannot work (``min_budget``) and one that works
    (the peak), op costs fixed. Whether a budget works need not be monotonic
    in the budget: this is where bisection lands, not a guarantee below it."""
    with pytest.MonkeyPatch.context() as patch:
        steady_clock(patch)
        ref = zoo.train(z, None, steps)
        while passed - failed > resolution:
            mid = (failed + passed) // 2
            if _works(z, ref, mid, steps):
                passed = mid
            else:
                failed = mid
    return passed


def bench_model(name: str, fractions: list[float], steps: int) -> tuple[list[list[str]], dict[str, Any]]:
    """The table rows of one family and what its unbudgeted run measured."""
    t0 = time.perf_counter()
    z = zoo.MODELS[name]()
    rows: list[list[str]] = []
    info: dict[str, Any] = {"about": z.about, "params": sum(p.numel() * p.element_size() for p in z.model.parameters())}
    probe = dtr(None)
    try:
        zoo.train(z, probe, steps)
    except Exception as exc:  # noqa: BLE001
        rows.append([name, "none", "-", "-", "-", "-", "-", "-", "-", "-", "no", _cell(zoo.first_line(exc))])
        info["wall_s"] = time.perf_counter() - t0
        return rows, info
    ps = probe.summary()
    peak = int(ps["peak_usage"])
    min_budget = ps.get("min_budget")
    info.update(peak=peak, min_budget=min_budget, min_budget_parts=ps.get("min_budget_parts"))
    budgets: list[tuple[float | None, int | None]] = [(None, None)]
    budgets += [(f, zoo.budget_for(peak, f, min_budget)) for f in fractions]
    failed_budgets = []
    for fraction, budget in budgets:
        r = run_pair(z, budget, steps)
        s = r["summary"]
        done = r["steps_done"]
        bitwise = "-" if done == 0 else ("yes" if not r["diffs"] else "NO")
        if budget is None:
            budget_text = f"none (peak {format_bytes(peak)})"
            pct = "-"
            over = "-"
        else:
            budget_text = f"{budget} ({format_bytes(budget)})"
            raised = fraction is not None and budget != int(peak * fraction)
            pct = f"{budget / peak:.0%}" + (f" ({fraction:.0%} raised to 1.1 x min_budget)" if raised else "")
            over = f"{s['peak_usage'] / budget:.3f}"
        mb = s.get("min_budget")
        mb_text = "-" if mb is None else format_bytes(int(mb))
        if budget is not None and min_budget is not None:
            mb_text = f"{format_bytes(int(min_budget))} / {mb_text}"
        ratio = "-" if not r["plain_ms"] or r["region_ms"] is None else f"{r['region_ms'] / r['plain_ms']:.2f}"
        ok = (
            r["error"] is None
            and not r["diffs"]
            and (budget is None or (s["peak_usage"] <= budget and s["evictions"] > 0))
        )
        if budget is not None and not ok:
            failed_budgets.append(budget)
        notes = []
        if r["error"]:
            notes.append(f"step {r['failed_step']}: {r['error']}")
        notes += r["diffs"][:3]
        rows.append(
            [
                name,
                budget_text,
                pct,
                bitwise,
                str(s["evictions"]),
                str(s["rematerializations"]),
                f"{s.get('parked', 0)} / {s.get('swaps_out', 0)}",
                over,
                mb_text,
                ratio + (f" ({r['region_ms']:.0f} / {r['plain_ms']:.0f} ms)" if ratio != "-" else ""),
                "yes" if ok else "no",
                _cell("; ".join(notes)),
            ]
        )
        print(" | ".join(rows[-1])[:300], flush=True)
    if failed_budgets:
        lowest = reach(z, int(min_budget or 0), peak, steps, peak // 100)
        info["reach"] = lowest
        print(f"{name}: lowest working budget {lowest} ({lowest / peak:.0%} of peak)", flush=True)
    info["wall_s"] = time.perf_counter() - t0
    return rows, info


def _revision() -> str:
    """The repository's commit (``+dirty`` when tracked files differ) and the library's mtime."""
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=False).stdout
        dirty = subprocess.run(["git", "status", "--porcelain", "-uno"], cwd=root, capture_output=True, text=True, check=False).stdout
    except OSError:
        return "unknown revision"
    from memscale._native import lib as _lib

    lib = Path(_lib.find_library())
    built = datetime.datetime.fromtimestamp(lib.stat().st_mtime).isoformat(timespec="minutes")
    return f"commit {head.strip()}{'+dirty' if dirty.strip() else ''}, library {lib.name} built {built}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="*", default=list(zoo.MODELS), choices=list(zoo.MODELS))
    p.add_argument("--fractions", nargs="*", type=float, default=[0.5, 0.3])
    p.add_argument("--steps", type=int, default=zoo.STEPS)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1: steady timings)")
    p.add_argument("--markdown", type=Path)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    rows: list[list[str]] = []
    infos: dict[str, dict[str, Any]] = {}
    for name in args.models:
        model_rows, infos[name] = bench_model(name, args.fractions, args.steps)
        rows += model_rows
    wall = time.perf_counter() - started
    command = "MEMSCALE_LIBRARY=build/libmemscale.so HF_HUB_OFFLINE=1 .venv/bin/python bench/zoo_bench.py " + " ".join(
        shlex.quote(a) for a in sys.argv[1:]
    )
    header = [
        "model",
        "budget (bytes)",
        "% of peak",
        "bitwise",
        "evictions",
        "remats",
        "parked / swaps out",
        "peak / budget",
        "min_budget (dtr(None) / this run)",
        "step time, region / plain (median)",
        "pass",
        "error (first line) / differences",
    ]
    table = "\n".join(
        ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]
    )
    families = "\n".join(
        f"- `{name}`: {info['about']}; parameters {format_bytes(info['params'])}"
        + (f", step peak {format_bytes(info['peak'])}" if "peak" in info else "")
        + (f", min_budget {format_bytes(int(info['min_budget']))}" if info.get("min_budget") is not None else "")
        + (
            f" ({', '.join(f'{k} {v}' for k, v in info['min_budget_parts'].items())})"
            if info.get("min_budget_parts")
            else ""
        )
        + (
            f"; lowest budget that works (op costs fixed at 1 us, bisected between min_budget and the peak to 1 % of peak): "
            f"{format_bytes(info['reach'])}, {info['reach'] / info['peak']:.0%} of peak, "
            f"{info['reach'] / info['min_budget']:.2f} x min_budget"
            if "reach" in info and info.get("min_budget")
            else ""
        )
        + f"; {info['wall_s']:.1f} s"
        for name, info in infos.items()
    )
    passed = sum(r[10] == "yes" for r in rows)
    text = f"""# The model-family zoo under DTR budgets

Date: {datetime.date.today().isoformat()}. {os.cpu_count()} CPU cores, {args.threads} torch thread(s), no GPU;
torch {torch.__version__}; memscale at {_revision()}. Models from `pytorch_plugin/tests/zoo.py` (random weights from configs). Each row: a
plain copy and a region copy of the model train {args.steps} steps interleaved (SGD after each step, the same
seeds, dropout on); "bitwise": every loss, gradient and buffer equal (`torch.equal`) to the plain run; "pass":
bitwise, no error and, under a budget, peak usage <= budget and evictions > 0; "parked": tensors a rebuild
parked in host memory (`dtr(park=True)`, the default). Budgets: "none" is
`memscale.dtr(None)` (the peak), then {', '.join(f'{f:.0%}' for f in args.fractions)} of that peak, or
1.1 x the engine's `min_budget` where that is higher. The step-time ratio compares the medians of the
{args.steps} steps (the region's first step under a budget also records and tunes). Wall time {wall:.0f} s.

    {command}

{passed} of {len(rows)} rows pass.

{table}

Families:

{families}
"""
    print(text)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
