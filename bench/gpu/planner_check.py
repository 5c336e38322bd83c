"""memscale plan's predictions against this GPU (issue 31): GPT-2, predicted vs measured peak and step time.

For each ``--configs`` entry (batch x sequence; default 8x512, 8x1024 and 32x512) the
GPT-2 of gpt2_dtr.py (124M, transformers, eager attention, fp32, dropout off, SGD) is

(1) planned: ``memscale.plan(model, batch, SGD, device="meta", cost_device=KEY,
    target=KEY)`` - recorded on ``meta`` (nothing allocated, nothing run), op costs
    from the cost model of the device table's entry for this GPU (KEY from
    ``torch.cuda.get_device_name``, or ``--cost-device``): the predicted peak with no
    eviction, the predicted step time (forward and backward), the least DTR budget;
(2) measured under PyTorch's own allocator (memscale is not installed; deterministic
    algorithms on, as gpt2_dtr.py):
    ``torch.cuda.max_memory_allocated`` over ``--warmup + --steps`` steps, the median
    step time (forward + backward between two synchronizations, and with SGD's
    step), the GPU's kernel time in one step (torch.profiler) and the top ops by
    device time next to the cost model's estimate for the same op name;
(3) with ``--measured-plan`` (default on), planned again with the step recorded on
    the device (measured op costs; the planner's view of the same step).

The batch is ``input_ids``, ``labels`` and an ``attention_mask`` of ones in both (1)
and (2): on ``meta``, transformers' packed-sequence check reads a value when the mask
is None. Also checked: the device table's memory against ``total_memory``.

    PYTHONPATH=pytorch_plugin MEMSCALE_LIBRARY=build/libmemscale.so python bench/gpu/planner_check.py --out DIR

Writes ``DIR/planner_check.json`` and prints markdown tables (summarize.py puts them
in gpu-results.md). Without a GPU it prints a skip message and exits 0; ``--device
cpu`` runs the same plumbing with a tiny model (step times on the CPU, no peak).
Needs build/memscale (the Go command ``memscale.plan`` calls).
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import _common

_common.setup_env()
import gpt2_dtr  # noqa: E402  (after setup_env: it puts the plugin on sys.path)

STEP = "planner_check"
GiB = 1 << 30


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="directory for planner_check.json")
    p.add_argument("--configs", default="8x512,8x1024,32x512", help="batch x sequence, a comma list")
    p.add_argument("--cost-device", default=None, help="the device table's key to estimate for (default: from the GPU's name)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--top", type=int, default=12, help="ops listed per config")
    p.add_argument("--no-measured-plan", action="store_true", help="skip (3), the plan of the step recorded on the device")
    p.add_argument("--time-budget", type=float, default=150.0, help="stop starting configs after this many seconds")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--dry-run", action="store_true", help="check imports and print the plan; touch no GPU")
    a = p.parse_args(argv)
    try:
        a.configs = [tuple(int(x) for x in c.lower().split("x")) for c in a.configs.split(",")]
        assert all(len(c) == 2 and c[0] > 0 and c[1] > 0 for c in a.configs)
    except (ValueError, AssertionError):
        p.error(f"--configs {a.configs!r}: want BATCHxSEQ items such as 8x512,8x1024")
    return a


def device_key(name: str, total: int) -> str | None:
    """The device table's key for a GPU name (None: not in the table)."""
    n = name.lower()
    if "h200" in n:
        return "h200"
    if "h100" in n:
        return "h100"
    if "a100" in n:
        return "a100-80gb" if total > 60 * GiB else "a100-40gb"
    if "4090" in n:
        return "rtx4090"
    if re.search(r"\bl4\b", n):
        return "l4"
    return None


def model_args(a: argparse.Namespace, batch: int, seq: int) -> argparse.Namespace:
    tiny = [] if a.device == "cuda" else ["--layers", "2", "--width", "64", "--heads", "2", "--vocab", "128"]
    return gpt2_dtr.parse_args(["--impl", "hf", "--batch", str(batch), "--seq", str(seq), "--device", a.device, *tiny])


def make_batch(torch: Any, margs: Any, batch: int, seq: int, device: str) -> dict[str, Any]:
    g = torch.Generator().manual_seed(1000)
    ids = torch.randint(0, margs.vocab, (batch, seq), generator=g).to(device)
    return {"input_ids": ids, "labels": ids, "attention_mask": torch.ones(batch, seq, dtype=torch.long, device=device)}


def trace_costs(trace: Path) -> Counter[str]:
    """The trace's op times in ns, summed by op name (``mm``, ``add``)."""
    out: Counter[str] = Counter()
    with gzip.open(trace, "rt") as f:
        for line in f:
            r = json.loads(line)
            if r.get("INSTRUCTION") == "CALL" and "TIME" in r:
                out[r["NAME"].split(".")[0]] += int(r["TIME"])
    return out


def plan_one(memscale: Any, torch: Any, model: Any, batch: dict[str, Any], key: str, work: Path, meta: bool) -> dict[str, Any]:
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    t0 = time.perf_counter()
    p = memscale.plan(model, batch, opt, device="meta" if meta else None, cost_device=key, target=key, ratios="0.5",
                      out=work, plot=False)
    r = p.plans[0]
    half = next((v for v in r["variants"] if v["variant"] == "dtr" and abs(v["ratio"] - 0.5) < 1e-6), {})
    return {
        "peak_bytes": r["memory"]["peak_bytes"], "step_ns": r["step_ns"],
        "min_budget_bytes": r["memory"]["min_feasible_budget_bytes"],
        "overhead_at_half": half.get("overhead") if half.get("status") == "ok" else None,
        "device_check": r["devices"][0] if r["devices"] else None, "costs": r["model"].get("costs"),
        "by_op_ns": dict(trace_costs(p.traces[0])), "wall_s": time.perf_counter() - t0,
    }


def measure(torch: Any, model: Any, batch: dict[str, Any], a: argparse.Namespace) -> dict[str, Any]:
    """Plain steps under PyTorch's allocator: peak, median times, kernel time and ops."""
    cuda = a.device == "cuda"
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def fwd_bwd() -> None:
        for p in model.parameters():
            p.grad = None
        model(**batch).loss.backward()

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    fb: list[float] = []
    whole: list[float] = []
    for i in range(a.warmup + a.steps):
        sync()
        t0 = time.perf_counter()
        fwd_bwd()
        sync()
        t1 = time.perf_counter()
        opt.step()
        sync()
        t2 = time.perf_counter()
        if i >= a.warmup:
            fb.append(t1 - t0)
            whole.append(t2 - t0)
    out: dict[str, Any] = {"fwd_bwd_s": _common.median(fb), "step_s": _common.median(whole), "fwd_bwd_all_s": fb}
    out["peak_bytes"] = int(torch.cuda.max_memory_allocated()) if cuda else None
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        fwd_bwd()
        sync()
    from torch.autograd import DeviceType

    by_op: Counter[str] = Counter()
    total = 0.0
    for e in prof.key_averages():
        us = (getattr(e, "self_device_time_total", None) or 0.0) if cuda else e.self_cpu_time_total
        # The kernels are rows of their own (device type CUDA) besides the ops that
        # launched them: the total counts the kernels once, the ops are per aten op.
        if not cuda or getattr(e, "device_type", None) == DeviceType.CUDA:
            total += us
        if e.key.startswith("aten::"):
            by_op[e.key[len("aten::"):]] += int(us * 1000)
    if cuda and not total:  # no kernel rows: the ops' own device time
        total = sum(by_op.values()) / 1000
    out["kernel_ns"] = int(total * 1000)
    out["by_op_ns"] = dict(by_op)
    return out


def dry_run(a: argparse.Namespace) -> int:
    import memscale  # noqa: F401
    from memscale._cli import native_command

    print(f"{STEP}: configs {', '.join(f'{b}x{s}' for b, s in a.configs)}; plan on meta with the cost model of "
          f"{a.cost_device or 'this GPU (from its name)'}, then {a.warmup}+{a.steps} plain steps under PyTorch's "
          f"allocator (peak allocated, median step time, one profiled step); native command: {native_command()}")
    return 0


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.dry_run:
        return dry_run(a)
    json_path = str(Path(a.out) / f"{STEP}.json") if a.out else None
    skipped = _common.skip_without_cuda(STEP, a.device, json_path)
    if skipped is not None:
        return skipped
    import torch

    import memscale

    t_start = time.perf_counter()
    cuda = a.device == "cuda"
    # As gpt2_dtr.py's Trainer (the recorded GPU runs): deterministic algorithms, no NaN fill.
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]
    except AttributeError:
        pass
    name = torch.cuda.get_device_name(0) if cuda else "cpu"
    total = int(torch.cuda.get_device_properties(0).total_memory) if cuda else 0
    key = a.cost_device or device_key(name, total) or "h100"
    from memscale._plan.costs import lookup_device

    gpu = lookup_device(key)
    result: dict[str, Any] = _common.record(STEP, status="ok", device=name, total_memory=total, cost_device=key,
                                            table_memory=gpu.memory_bytes, torch=torch.__version__, configs=[])
    note = "" if a.cost_device or device_key(name, total) else f" ({name} is not in the table: estimated for {key})"
    print(f"{STEP}: {name}, cost model {gpu.name}{note}; table memory {_common.fmt_bytes(gpu.memory_bytes)}, "
          f"CUDA total {_common.fmt_bytes(total) if cuda else '-'}", flush=True)
    rows, ops = [], []
    with tempfile.TemporaryDirectory(prefix="memscale-planner-check-") as work:
        for b, s in a.configs:
            if time.perf_counter() - t_start > a.time_budget:
                print(f"{STEP}: time budget of {a.time_budget:.0f} s used up: {b}x{s} not run", flush=True)
                result["configs"].append({"batch": b, "seq": s, "status": "not run (time budget)"})
                continue
            cfg: dict[str, Any] = {"batch": b, "seq": s}
            result["configs"].append(cfg)
            try:
                margs = model_args(a, b, s)
                with torch.device("meta"):
                    meta_model = gpt2_dtr.build_model(margs, "hf")
                cfg["predicted"] = plan_one(memscale, torch, meta_model, make_batch(torch, margs, b, s, "meta"), key,
                                            Path(work) / f"meta-{b}x{s}", True)
                del meta_model
                model = gpt2_dtr.build_model(margs, "hf").to(a.device).train()
                result["parameters"] = sum(p.numel() for p in model.parameters())
                batch = make_batch(torch, margs, b, s, a.device)
                cfg["measured"] = measure(torch, model, batch, a)
                if not a.no_measured_plan:
                    try:
                        cfg["measured_plan"] = plan_one(memscale, torch, model, batch, key, Path(work) / f"dev-{b}x{s}", False)
                    except Exception as exc:  # noqa: BLE001 - reported, the step goes on
                        cfg["measured_plan"] = {"error": f"{type(exc).__name__}: {exc}"[:400]}
                del model, batch
                if cuda:
                    torch.cuda.empty_cache()
            except Exception as exc:  # noqa: BLE001 - one config failing does not stop the others
                cfg["status"] = "failed"
                cfg["error"] = f"{type(exc).__name__}: {exc}"[:400]
                result["status"] = "failed"
                print(f"{STEP}: {b}x{s}: {cfg['error']}", flush=True)
                continue
            pr, me, mp = cfg["predicted"], cfg["measured"], cfg.get("measured_plan", {})
            err = lambda p, m: f"{100 * (p / m - 1):+.1f} %" if p and m else "-"  # noqa: E731
            pk = me["peak_bytes"]
            last = f"{mp['step_ns'] / 1e6:.1f} ms" if "step_ns" in mp else mp.get("error", "-")[:80].replace("|", "/")
            rows.append(f"| {b} x {s} | {_common.fmt_bytes(pr['peak_bytes'])} | {_common.fmt_bytes(pk) if pk else '-'} | "
                        f"{err(pr['peak_bytes'], pk)} | {pr['step_ns'] / 1e6:.1f} ms | {1e3 * me['fwd_bwd_s']:.1f} ms | "
                        f"{err(pr['step_ns'] / 1e9, me['fwd_bwd_s'])} | {1e3 * me['step_s']:.1f} ms | "
                        f"{me['kernel_ns'] / 1e6:.1f} ms | {last} |")
            for op, ns in Counter(me["by_op_ns"]).most_common(a.top):
                p_ns = pr["by_op_ns"].get(op)
                ops.append(f"| {b} x {s} | {op} | {ns / 1e6:.2f} ms | {p_ns / 1e6:.2f} ms | {err(p_ns, ns)} |" if p_ns else
                           f"| {b} x {s} | {op} | {ns / 1e6:.2f} ms | - | - |")
            print(f"{STEP}: {b}x{s}: peak predicted {_common.fmt_bytes(pr['peak_bytes'])} measured "
                  f"{_common.fmt_bytes(pk) if pk else '-'}; fwd+bwd predicted {pr['step_ns'] / 1e6:.1f} ms measured "
                  f"{1e3 * me['fwd_bwd_s']:.1f} ms (kernels {me['kernel_ns'] / 1e6:.1f} ms)", flush=True)
    print()
    print(f"GPT-2 ({result.get('parameters', 0) / 1e6:.1f}M parameters, eager attention, fp32, SGD) planned on meta "
          f"with the cost model of {gpu.name}{note}, "
          f"measured on {name} under PyTorch's allocator ({a.warmup} warm-up + {a.steps} steps, medians):")
    print()
    print("| batch x seq | peak predicted | peak measured | error | fwd+bwd predicted | measured | error | "
          "step with SGD | kernel time (1 step) | fwd+bwd planned from the device's recording |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(r)
    print()
    print("Top ops by measured time (device time on a GPU; self CPU time with --device cpu), against the cost model's:")
    print()
    print("| batch x seq | op | measured | predicted | error |")
    print("|---|---|---:|---:|---:|")
    for r in ops:
        print(r)
    result["wall_s"] = time.perf_counter() - t_start
    _common.write_json(json_path, result)
    return 0 if result["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
