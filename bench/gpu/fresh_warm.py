"""GPT-2 under memscale + DTR in a fresh process vs a warm one (issue 29).

On the H200, gpt2_dtr's DTR step (a fresh process, budget 50 % of the native
peak) took 0.41 s while profile_step's budgeted variant, after unbudgeted
variants in the same process, took 0.24-0.32 s: a fresh allocator's cache is
bounded near the budget, DTR holds allocated memory at the budget all step, and
cache misses remap 2 MiB granules. This script measures that directly. Each
variant runs in its own process (a pluggable allocator is installed once per
process, before CUDA is used):

``fresh``       ``memscale.install()``, then ``--warmup + --steps`` steps, each
                step's forward and backward inside ``memscale.dtr(budget)``.
``warm``        the same, after ``--warm-steps`` plain steps outside any region
                (the cache first grows to the native peak, as in profile_step).
``fresh-plan``  ``fresh`` plus ``memscale_step_boundary(0)`` after each step
                (the allocator's step plans, allocator/plan.go), with the
                budget also given to ``memscale_set_budget`` so that the
                boundary sees it; recorded as not run when the library lacks
                the call. The regions' own boundaries (at each exit, since
                issue 29's plugin side) are off in every variant, so
                ``fresh`` and ``warm`` run without step plans.

Per step: the time (synchronized), and the allocator's granule traffic from
``memscale.memory_stats(0)`` deltas (``num_map``, ``num_unmap``, ``num_remap``,
``num_map_calls``) with ``reserved_bytes.all.current``. The budget is
``--fraction`` (0.5) x the native peak, read from ``--native-json`` (the
``gpt2_native.json`` that gpt2_dtr.py writes) or measured by gpt2_dtr.py's
native worker. The issue's check: fresh and warm median step times within 5 %
of each other.

Writes ``fresh_warm.json`` into ``--out-dir`` (each worker also writes its
own). ``--device cpu`` with a tiny model runs the plumbing without a GPU (no
allocator counters there); without a GPU and without ``--device cpu`` it
prints a skip message and exits 0.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import time
from typing import Any

import _common

STEP = "fresh_warm"
VARIANTS = ("fresh", "warm", "fresh-plan")
COUNTERS = ("num_map", "num_unmap", "num_remap", "num_map_calls")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", choices=VARIANTS, help="internal: run one variant")
    p.add_argument("--result", help="worker: JSON result file")
    p.add_argument("--out-dir", default=".", help="driver: directory for the JSON results (default .)")
    p.add_argument("--time-budget", type=float, default=240.0, help="driver: seconds for all subprocesses (default 240)")
    p.add_argument("--variants", default=",".join(VARIANTS), help="driver: comma list of variants (default all)")
    p.add_argument("--native-json", help="driver: gpt2_dtr.py's gpt2_native.json (its peak sets the budget)")
    p.add_argument("--fraction", type=float, default=0.5, help="DTR budget as a fraction of the native peak (default 0.5)")
    p.add_argument("--budget", type=int, default=None, help="worker: DTR budget in bytes")
    p.add_argument("--warm-steps", type=int, default=2, help="warm: plain steps before the DTR ones (default 2)")
    p.add_argument("--dry-run", action="store_true", help="check imports and print the plan; touch no GPU")
    # model and run, as gpt2_dtr.py
    p.add_argument("--impl", choices=("auto", "hf", "mini"), default="auto")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--width", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--attn", default="eager")
    p.add_argument("--steps", type=int, default=5, help="measured DTR steps (default 5)")
    p.add_argument("--warmup", type=int, default=2, help="DTR steps before the measured ones (default 2)")
    p.add_argument("--heuristic", default=None)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    a = p.parse_args(argv)
    if not 0 < a.fraction <= 1:
        p.error(f"--fraction {a.fraction}: must be in (0, 1]")
    if a.steps < 1 or a.warmup < 0 or a.warm_steps < 1:
        p.error("--steps and --warm-steps must be >= 1, --warmup >= 0")
    bad = [v for v in a.variants.split(",") if v not in VARIANTS]
    if bad:
        p.error(f"--variants: unknown {bad} (known: {', '.join(VARIANTS)})")
    if a.worker and not a.dry_run and (not a.result or a.budget is None):
        p.error("--worker needs --result and --budget")
    return a


def model_args(a: argparse.Namespace) -> list[str]:
    """gpt2_dtr.py's arguments for the same model and run."""
    out = [f"--impl={a.impl}", f"--layers={a.layers}", f"--width={a.width}", f"--heads={a.heads}", f"--seq={a.seq}",
           f"--vocab={a.vocab}", f"--attn={a.attn}", f"--steps={a.steps}", f"--warmup={max(a.warmup, 1)}",
           f"--device={a.device}", f"--batch={a.batch}"]
    if a.heuristic:
        out.append(f"--heuristic={a.heuristic}")
    return out


# --------------------------------------------------------------------------- worker


def _counters(a: argparse.Namespace) -> dict[str, int] | None:
    if a.device != "cuda":
        return None
    import memscale

    st = memscale.memory_stats(0)
    out = {k: int(st.get(k, 0)) for k in COUNTERS}
    out["reserved"] = int(st.get("reserved_bytes.all.current", 0))
    return out


def worker(a: argparse.Namespace) -> dict[str, Any]:
    import gpt2_dtr
    import memscale
    from memscale._allocator import boundary as _boundary

    # The variants say where steps end themselves (fresh-plan only): the
    # region's own boundary at each exit stays off.
    _boundary.enabled = False
    on_gpu = a.device == "cuda"
    if on_gpu:
        inst = memscale.install(backend="cuda")  # before anything touches CUDA
    ga = gpt2_dtr.parse_args(model_args(a))
    region = memscale.dtr(a.budget, heuristic=a.heuristic)
    tr = gpt2_dtr.Trainer(ga, a.batch, region)
    out: dict[str, Any] = gpt2_dtr._device_info(ga)
    out.update(variant=a.worker, impl=tr.impl, batch=a.batch, budget=a.budget)
    if on_gpu:
        out["memscale_library"] = str(inst.library)
    boundary = None
    if a.worker == "fresh-plan":
        try:  # the handle memscale itself loaded
            from memscale._native import lib as _native

            lib = _native.lib()
        except Exception:  # noqa: BLE001 - the same file by path (dlopen returns the same handle)
            lib = ctypes.CDLL(str(_common.library_path()))
        if not hasattr(lib, "memscale_step_boundary"):
            raise RuntimeError(f"{_common.library_path()} has no memscale_step_boundary (older build)")
        lib.memscale_step_boundary.argtypes = [ctypes.c_int]
        lib.memscale_set_budget.argtypes = [ctypes.c_int, ctypes.c_int64]
        if on_gpu and lib.memscale_set_budget(0, a.budget) != 0:
            raise RuntimeError("memscale_set_budget failed")
        boundary = lib.memscale_step_boundary
        out["step_boundary"] = "memscale_step_boundary(0) after each step" if on_gpu else "not called on the cpu"
    if a.worker == "warm":
        tr.region = None
        for i in range(a.warm_steps):
            tr.step(i)
        out["warm_step_times"] = [round(t, 5) for t in tr.times]
        out["warm_reserved"] = (_counters(a) or {}).get("reserved")
        tr.times, tr.losses, tr.step_stats = [], [], []
        tr.region = region
    per_step: list[dict[str, Any]] = []
    prev = _counters(a)
    for i in range(a.warmup + a.steps):
        tr.step(i)
        if boundary is not None and on_gpu:
            if boundary(0) != 0:
                raise RuntimeError("memscale_step_boundary failed")
        cur = _counters(a)
        row: dict[str, Any] = {"seconds": round(tr.times[-1], 5), **(tr.step_stats[-1] if tr.step_stats else {})}
        if cur is not None and prev is not None:
            row.update({k: cur[k] - prev[k] for k in COUNTERS})
            row["reserved"] = cur["reserved"]
        per_step.append(row)
        prev = cur
        print(f"  {a.worker} step {i}: {row}", flush=True)
    steady = per_step[a.warmup:]
    out.update(
        per_step=per_step,
        step_times=[r["seconds"] for r in per_step],
        median_step_s=_common.median([r["seconds"] for r in steady]),
        losses=tr.losses,
    )
    if on_gpu:
        out["remaps_per_steady_step"] = [r.get("num_remap") for r in steady]
        st = memscale.memory_stats(0)
        keep = ("reserved_bytes.all.peak", "num_steps", "num_step_plans", "num_step_plans_reused", "step_plan_active",
                "num_step_plan_placed", "num_step_plan_missed", "step_plan_need_bytes", "budget_bytes", "cache_bound_bytes")
        out["memscale_stats"] = {k: int(st[k]) for k in keep if k in st}
    print(f"{a.worker}: median step {out['median_step_s']:.4f} s, remaps per steady step "
          f"{out.get('remaps_per_steady_step')}", flush=True)
    return out


def run_worker(a: argparse.Namespace) -> int:
    result = _common.record(f"{STEP}_{a.worker}", status="failed", worker=a.worker, device=a.device)
    try:
        result.update(worker(a))
        result["status"] = "ok"
        rc = 0
    except Exception as exc:  # noqa: BLE001 - reported in the JSON
        import traceback

        traceback.print_exc()
        result["error"] = f"{type(exc).__name__}: {str(exc)[:4000]}"
        print(f"FAIL {STEP}_{a.worker}: {result['error']}", flush=True)
        rc = 1
    _common.write_json(a.result, result)
    return rc


# --------------------------------------------------------------------------- driver


def driver(a: argparse.Namespace) -> int:
    t_start = time.monotonic()
    deadline = t_start + a.time_budget
    out_dir = os.path.abspath(a.out_dir)
    os.makedirs(out_dir, exist_ok=True)
    here = os.path.dirname(os.path.abspath(__file__))
    result = _common.record(STEP, status="ok", config=vars(a).copy())
    final = os.path.join(out_dir, f"{STEP}.json")

    def run(cmd: list[str], path: str, cap: float) -> dict[str, Any]:
        if os.path.exists(path):
            os.remove(path)
        t = min(cap, deadline - time.monotonic())
        if t < 10:
            return {"status": "not run", "reason": f"time budget used up ({a.time_budget:.0f} s)"}
        r = _common.run_child(cmd, t)
        res = _common.read_json(path) or {"status": "crashed", "error": f"no result written (exit {r['rc']})"}
        res["process"] = r
        if r["timed_out"]:
            res["status"] = "timeout"
        return res

    native = _common.read_json(a.native_json) if a.native_json else None
    if not (native and native.get("status") == "ok" and native.get("peak_allocated")):
        path = os.path.join(out_dir, "fresh_warm_native.json")
        native = run([sys.executable, os.path.join(here, "gpt2_dtr.py"), "--worker", "native", "--result", path,
                      *model_args(a)], path, 150)
    result["native"] = {k: native.get(k) for k in ("status", "peak_allocated", "median_step_s", "error", "reason")}
    if native.get("status") != "ok" or not native.get("peak_allocated"):
        result["status"] = "failed"
        result["error"] = "no native peak to set the budget from"
        _common.write_json(final, result)
        print(f"FAIL {STEP}: {result['error']}", flush=True)
        return 1
    budget = int(a.fraction * native["peak_allocated"])
    result["budget"] = budget
    runs: dict[str, Any] = {}
    for v in a.variants.split(","):
        path = os.path.join(out_dir, f"fresh_warm_{v.replace('-', '_')}.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", v, "--result", path, f"--budget={budget}",
               f"--warm-steps={a.warm_steps}", *model_args(a), f"--warmup={a.warmup}"]
        runs[v] = run(cmd, path, 150)
        _common.write_json(final, {**result, "runs": runs})
    result["runs"] = runs
    result["summary"] = summarize(runs, native)
    result["seconds"] = round(time.monotonic() - t_start, 1)
    _common.write_json(final, result)
    print("\nfresh vs warm")
    for k, v in result["summary"].items():
        print(f"  {k:<34} {v}")
    return 0 if all(r.get("status") == "ok" for r in runs.values()) else 1


def summarize(runs: dict[str, Any], native: dict[str, Any]) -> dict[str, Any]:
    s: dict[str, Any] = {"native_median_step_s": native.get("median_step_s")}
    for v, r in runs.items():
        s[f"{v}_status"] = r.get("status")
        s[f"{v}_median_step_s"] = r.get("median_step_s")
        s[f"{v}_remaps_per_steady_step"] = r.get("remaps_per_steady_step")
        s[f"{v}_peak_reserved"] = (r.get("memscale_stats") or {}).get("reserved_bytes.all.peak")
    f, w = (runs.get("fresh") or {}).get("median_step_s"), (runs.get("warm") or {}).get("median_step_s")
    if f and w:
        s["fresh_over_warm"] = round(f / w, 4)
        s["within_5_percent"] = abs(f / w - 1) <= 0.05
    fp = (runs.get("fresh-plan") or {}).get("median_step_s")
    if fp and w:
        s["fresh_plan_over_warm"] = round(fp / w, 4)
        s["fresh_plan_within_5_percent"] = abs(fp / w - 1) <= 0.05
    return s


def dry_run(a: argparse.Namespace) -> int:
    print(f"{STEP} --dry-run: plan ({'worker ' + a.worker if a.worker else 'driver'})")
    print(f"  - model: GPT-2 {a.layers} layers, width {a.width}, seq {a.seq}, batch {a.batch}, device {a.device}")
    print(f"  - budget {a.fraction} x the native peak ({a.native_json or 'measured by gpt2_dtr.py --worker native'})")
    print(f"  - variants {a.variants}: {a.warmup} + {a.steps} DTR steps each; warm first runs {a.warm_steps} plain steps")
    import torch

    print(f"  torch {torch.__version__} imports")
    import gpt2_dtr  # noqa: F401
    import memscale

    lib = _common.library_path()
    print(f"  memscale imports ({memscale.__file__}); library {lib} {'exists' if lib.exists() else 'MISSING'}")
    if lib.exists():
        has = hasattr(ctypes.CDLL(str(lib)), "memscale_step_boundary")
        print(f"  memscale_step_boundary {'exported' if has else 'MISSING (fresh-plan will fail)'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return _common.driver_or_worker(STEP, parse_args(argv), dry_run, run_worker, driver)


if __name__ == "__main__":
    sys.exit(main())
