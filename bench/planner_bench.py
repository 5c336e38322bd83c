"""memscale plan's predictions against this machine (issue 31): for small
models at three batch sizes, the predicted peak (recorded on ``meta``, no op
run) against a plain run's measured peak, and the overhead the planner
predicts at 50 % of the step's peak (a CPU-recorded step replayed by the
engine) against the measured compute overhead of a real budgeted run.

    PYTHONPATH=pytorch_plugin MEMSCALE_LIBRARY=$PWD/build/libmemscale.so \\
        HF_HUB_OFFLINE=1 .venv/bin/python bench/planner_bench.py --out bench/results/planner.md

The plain run's peak: after a warm-up step (the optimizer's state exists),
the bytes live at the start of a step (parameters, optimizer state, the
batch) plus the highest net allocation of the CPU allocator during forward,
backward and ``optimizer.step()`` (torch.profiler, profile_memory). The
real budgeted run: ``memscale.dtr(budget)`` around forward and backward at
half the region's unbudgeted peak, 3 steps, the last step's
``(base + remat) / base`` of measured op costs.
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import memscale


def _mlp(b: int) -> tuple[torch.nn.Module, Any, Any]:
    m = torch.nn.Sequential(*[layer for _ in range(6) for layer in (torch.nn.Linear(512, 512), torch.nn.GELU())], torch.nn.Linear(512, 10))
    return m, (torch.randn(b, 512), torch.randint(0, 10, (b,))), F.cross_entropy


def _cnn(b: int) -> tuple[torch.nn.Module, Any, Any]:
    def block(i: int, o: int) -> list[torch.nn.Module]:
        return [torch.nn.Conv2d(i, o, 3, padding=1), torch.nn.BatchNorm2d(o), torch.nn.ReLU()]

    m = torch.nn.Sequential(*block(3, 32), *block(32, 32), torch.nn.MaxPool2d(2), *block(32, 64), *block(64, 64),
                            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 10))
    return m, (torch.randn(b, 3, 32, 32), torch.randint(0, 10, (b,))), F.cross_entropy


def _gpt2(b: int) -> tuple[torch.nn.Module, Any, Any]:
    import transformers

    transformers.logging.set_verbosity_error()
    cfg = transformers.GPT2Config(n_layer=4, n_embd=256, n_head=4, n_positions=128, vocab_size=2048)
    m = transformers.GPT2LMHeadModel(cfg)
    ids = torch.randint(0, 2048, (b, 128))
    return m, {"input_ids": ids, "labels": ids}, None


MODELS = {"mlp": (_mlp, (512, 1024, 2048)), "cnn": (_cnn, (8, 16, 32)), "gpt2-4l": (_gpt2, (2, 4, 8))}


def _loss(model: Any, batch: Any, loss_fn: Any) -> torch.Tensor:
    if loss_fn is not None:
        return loss_fn(model(batch[0]), batch[1])
    return model(**batch).loss


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def measured_peak(model: Any, batch: Any, loss_fn: Any, opt: Any) -> int:
    """A plain step's peak on the CPU allocator (see the module docstring)."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    for _ in range(2):  # warm-up: the optimizer's state, lazy initialisation
        _loss(model, batch, loss_fn).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    base = sum(_nbytes(p) for p in model.parameters()) + sum(_nbytes(b) for b in model.buffers())
    base += sum(_nbytes(v) for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor))
    base += sum(_nbytes(t) for t in (batch.values() if isinstance(batch, dict) else batch) if isinstance(t, torch.Tensor))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        _loss(model, batch, loss_fn).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    ev = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        n = stack.pop()
        if n.tag == _EventType.Allocation and str(n.extra_fields.device) == "cpu":
            ev.append((n.start_time_ns, int(n.extra_fields.alloc_size)))
        stack.extend(n.children)
    live = top = 0
    for _, size in sorted(ev):
        live += size
        top = max(top, live)
    return base + top


def measured_overhead(model: Any, batch: Any, loss_fn: Any, budget: int) -> tuple[float, int]:
    region = memscale.dtr(budget=budget)
    for _ in range(3):
        with region:
            _loss(model, batch, loss_fn).backward()
        model.zero_grad(set_to_none=True)
        s = region.summary()
    return float(s["overhead"]), int(s["peak_usage"])


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path)
    p.add_argument("--models", default=",".join(MODELS))
    args = p.parse_args()
    torch.manual_seed(0)
    rows = []
    for name in args.models.split(","):
        make, sizes = MODELS[name]
        for b in sizes:
            torch.manual_seed(0)
            model, batch, loss_fn = make(b)
            opt = torch.optim.Adam(model.parameters())
            with tempfile.TemporaryDirectory() as d:
                t0 = time.perf_counter()
                meta = memscale.plan(model, batch, opt, loss_fn, device="meta", out=Path(d) / "meta", plot=False).plans[0]
                cpu = memscale.plan(model, batch, opt, loss_fn, out=Path(d) / "cpu", ratios="0.5", plot=False).plans[0]
                wall = time.perf_counter() - t0
            pred_peak = meta["memory"]["peak_bytes"]
            half = next(v for v in cpu["variants"] if v["variant"] == "dtr" and abs(v["ratio"] - 0.5) < 1e-6)
            peak = measured_peak(model, batch, loss_fn, opt)
            budget = int(0.5 * cpu["memory"]["trace_peak_bytes"])
            try:
                over, used = measured_overhead(model, batch, loss_fn, budget)
            except memscale.MemscaleError:  # infeasible at this budget
                over, used = float("nan"), 0
            rows.append((name, b, pred_peak, peak, half["overhead"] if half["status"] == "ok" else float("nan"), over, wall))
            print(f"{name} b{b}: peak predicted {pred_peak / 2**20:.2f} MiB measured {peak / 2**20:.2f} MiB "
                  f"({100 * (pred_peak / peak - 1):+.1f} %); overhead at 50 % predicted {half['overhead']:.3f} "
                  f"({half['status']}) measured {over:.3f} (region peak {used / 2**20:.2f} MiB of {budget / 2**20:.2f}); plan {wall:.1f} s", flush=True)
    if args.out:
        lines = [
            "# memscale plan: predictions against this machine",
            "",
            f"{time.strftime('%Y-%m-%d')}, {platform.node()} ({platform.processor() or platform.machine()}, CPU), torch {torch.__version__}.",
            "",
            "    PYTHONPATH=pytorch_plugin MEMSCALE_LIBRARY=$PWD/build/libmemscale.so HF_HUB_OFFLINE=1 \\",
            "        .venv/bin/python bench/planner_bench.py --out bench/results/planner.md",
            "",
            "Predicted peak: `memscale.plan(..., device=\"meta\")` (nothing run; Adam's state and step from a meta copy).",
            "Measured peak: a plain step's (forward, backward, `optimizer.step()`) on the CPU allocator, torch.profiler.",
            "Predicted overhead: the step recorded on the CPU (measured op costs), replayed by the engine at 50 % of its",
            "forward+backward peak (default heuristic). Measured: `memscale.dtr(budget)` at that budget, third step,",
            "`(base + remat) / base` of measured op costs.",
            "",
            "| model | batch | peak predicted | peak measured | error | overhead at 50 % predicted | measured | error | plan wall |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for name, b, pp, mp, po, mo, wall in rows:
            lines.append(f"| {name} | {b} | {pp / 2**20:.2f} MiB | {mp / 2**20:.2f} MiB | {100 * (pp / mp - 1):+.1f} % | "
                         f"{po:.3f} | {mo:.3f} | {100 * (po / mo - 1):+.1f} % | {wall:.1f} s |")
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
