"""memscale plan's predictions against this machine (issue 31): for small
models at three batch sizes, the predicted peak (recorded on ``meta``, no op
run) against a plain run's measured peak, and the overhead the planner
predicts at 50 % of the step's peak (a CPU-recorded step replayed by the
engine) against the measured compute overhead of a real budgeted run.

    PYTHONPATH=pytorch_plugin MEMSCALE_LIBRARY=$PWD/build/libmemscale.so \\
        HF_HUB_OFFLINE=1 .venv/bin/python bench/planner_bench.py --out bench/results/planner.md

``--gpu`` instead plans, on ``meta`` with the H100 and H200 cost models, the
GPT-2 configurations whose GPU runs are recorded in bench/results/gpu-2026-11-27-*.md
(bench/gpu/gpt2_dtr.py and profile_step.py) and writes the predicted-vs-measured
table as the section "Against the GPU results" of ``--out`` (the rest of the
file is kept; the CPU mode likewise keeps that section).

The plain run's peak: after a warm-up step (the optimizer's state exists),
the bytes live at the start of a step (parameters, optimizer state, the
batch) plus the highest net allocation of the CPU allocator during forward,
backward and ``optimizer.step()`` (torch.profiler, profile_memory).

The overhead at 50 %: the budget is half the step's peak with nothing
evicted (the trace's peak, which is the unbudgeted region's ``peak_usage``
byte for byte). Predicted: ``memscale.plan(..., heuristic="auto",
repeats=5, overhead_limit=math.inf)``, the step recorded 5 times on the CPU (each op's median time)
and replayed as the region runs it (its engine configuration, rebuilds and
pinned gradients; a first step with the default heuristic, tuned, the
reported step with the choice). Measured: ``memscale.dtr(budget)`` entered
for STEPS steps; the first records and tunes, the median of the others'
``(base + remat) / base`` (each step's own measured op costs,
``last_summary()``) is the measured overhead. A cell where both refuse the
budget (the planner: the region's first step does not finish; the region:
it raised) is an agreement, reported as such. Torch runs one thread
(``--threads``): the machine has 2 cores shared with other jobs, and two
threads per op against them made op times vary 5x between two recordings
of the same step.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
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


STEPS = 8
#: Recordings of the step whose median op times the prediction replays.
REPEATS = 5


def measured_overhead(model: Any, batch: Any, loss_fn: Any, budget: int) -> tuple[list[float], str, int, float]:
    """A real region at ``budget``: each step's overhead (``last_summary()``;
    the first one records and tunes), the configuration the engine chose, the
    highest usage, and the overhead the engine's tuning predicted for the
    choice (its replay of the first step's recording, with that step's
    measured costs; nan when it did not tune)."""
    region = memscale.dtr(budget=budget)
    overs: list[float] = []
    for i in range(STEPS):
        try:
            with region:
                _loss(model, batch, loss_fn).backward()
        except memscale.MemscaleError:
            if i == 0:
                raise  # the budget refused
            model.zero_grad(set_to_none=True)
            return overs, f"failed at step {i + 1}", 0, float("nan")
        model.zero_grad(set_to_none=True)
        overs.append(float(region.last_summary()["overhead"]))
    s = region.summary()
    tuning = s["tuning"] or {}
    tuned = float(tuning.get("overhead") or "nan")
    return overs, str(tuning.get("choice") or tuning.get("error") or "-"), int(s["peak_usage"]), tuned


def _policy(cell: str) -> str:
    """The configuration of a plan's variant ("auto: msps" -> "msps")."""
    return cell.split(": ", 1)[1] if ": " in cell else cell


# --------------------------------------------------------------------------- against the GPU results

GiB = 1 << 30
GPU_SECTION = "## Against the GPU results"
#: Where the generated GPU section ends: what follows (notes written by hand) is kept.
GPU_END = "<!-- end of the section bench/planner_bench.py --gpu writes -->"

#: What bench/results/gpu-2026-11-27-*.md recorded (GiB as printed there, two decimals).
#: gpt2_dtr.py: GPT-2 124M (HF, eager attention, dropout off, fp32, SGD), seq 512, batch 8;
#: its probes: 2 native steps (the second's time), 1 memscale step under
#: install(threshold="95%") + dtr(budget=that); profile_step.py: the same model at 8 x 1024
#: (n_positions 1024), peaks from memscale.max_memory_allocated.
MEASURED: dict[str, dict[str, Any]] = {
    "h100": {
        "file": "gpu-2026-11-27-h100.md",
        "card": 79.18 * GiB,  # torch.cuda.get_device_properties().total_memory
        "s512": {"step": 0.0991, "peak": 7.92 * GiB, "budget": 3.96 * GiB, "engine": 1.037, "wall": 4.22},
        "native": {42: (39.34 * GiB, 0.4672), 63: (58.71 * GiB, 0.6922), 85: None},
        "memscale": {126: True, 189: True, 283: False},
        # gpu-2026-11-27-h100-rerun.md, profile_step.py at 8 x 512
        "s512_profile": {"step": 0.1000, "peak": 7.91 * GiB},
    },
    "h200": {
        "file": "gpu-2026-11-27-h200.md",
        "card": 139.80 * GiB,
        "s512": {"step": 0.0919, "peak": 7.92 * GiB, "budget": 3.96 * GiB, "engine": 1.008, "wall": 4.50},
        "native": {75: (69.79 * GiB, 0.7677), 112: (103.95 * GiB, 1.1453), 150: None},
        "memscale": {224: True, 336: True, 504: False},
        # profile_step.py at 8 x 1024: first run (gpu-2026-11-27-h200.md) and rerun 1 (-h200-rerun.md)
        "s1024": {"step": (0.1963, 0.1972), "peak": 17.55 * GiB, "budget": (1.33, 1.62), "card": (1.23, 1.09),
                  "host_timer": (1.24, 1.19)},
    },
}


def _gpt2_meta(seq: int) -> Any:
    """gpt2_dtr.py's model, made on meta (nothing allocated)."""
    import transformers

    transformers.logging.set_verbosity_error()
    cfg = transformers.GPT2Config(
        n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=seq, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, use_cache=False, bos_token_id=0, eos_token_id=0, attn_implementation="eager",
    )
    with torch.device("meta"):
        return transformers.GPT2LMHeadModel(cfg)


def _gpt2_batch(seq: int, b: int) -> dict[str, torch.Tensor]:
    # attention_mask: on meta, transformers' packed-sequence check reads a value when it is None
    ids = torch.zeros(b, seq, dtype=torch.long, device="meta")
    return {"input_ids": ids, "labels": ids, "attention_mask": torch.ones(b, seq, dtype=torch.long, device="meta")}


class _Planner:
    """memscale.plan of GPT-2 on meta, cached by (seq, batch, cost device, budgets)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.models: dict[int, Any] = {}
        self.cache: dict[tuple[Any, ...], dict[str, Any]] = {}
        self.calls = 0
        self.wall = 0.0

    def __call__(self, seq: int, b: int, dev: str, budgets: tuple[int, ...] = (), ratios: str = "0.5",
                 heuristic: str = "default") -> dict[str, Any]:
        key = (seq, b, dev, budgets, ratios, heuristic)
        if key not in self.cache:
            if seq not in self.models:
                self.models[seq] = _gpt2_meta(seq)
            m = self.models[seq]
            opt = torch.optim.SGD(m.parameters(), lr=1e-4)
            t0 = time.perf_counter()
            p = memscale.plan(m, _gpt2_batch(seq, b), opt, device="meta", cost_device=dev, target=dev,
                              budgets=[f"{x}B" for x in budgets] or None, ratios=ratios, heuristic=heuristic,
                              out=self.workdir / f"s{seq}-b{b}-{dev}-{len(self.cache)}", plot=False)
            self.wall += time.perf_counter() - t0
            self.calls += 1
            self.cache[key] = p.plans[0]
        return self.cache[key]


def _largest(fits: Any, lo: int, hi: int) -> int:
    """The largest b in [lo, hi) with fits(b) (fits(lo) true, monotone), by bisection."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def _pct(pred: float, meas: float) -> str:
    return f"{100 * (pred / meas - 1):+.1f} %"


def _g(n: float) -> str:
    return f"{n / GiB:.2f} GiB"


def gpu_section(workdir: Path) -> str:
    """Plan the GPU runs' configurations and write the predicted-vs-measured section."""
    plan = _Planner(workdir)
    rows: list[str] = []
    notes: list[str] = []
    batch_rows: list[str] = []
    t_start = time.perf_counter()
    for dev in ("h100", "h200"):
        M = MEASURED[dev]
        name = "H100" if dev == "h100" else "H200"
        src = f"gpu-2026-11-27-{dev}.md"
        s = M["s512"]
        r = plan(512, 8, dev, (int(s["budget"]),))
        peak, step = r["memory"]["peak_bytes"], r["step_ns"] / 1e9
        at = next(v for v in r["variants"] if v["variant"] == "dtr" and abs(v["budget_bytes"] - int(s["budget"])) < 1024)
        rows.append(f"| {name} | 8 x 512 | peak, no eviction | {_g(peak)} | {_g(s['peak'])} | {_pct(peak, s['peak'])} | {src} (gpt2_dtr) |")
        rows.append(f"| {name} | 8 x 512 | step time (fwd+bwd; measured with SGD's step) | {1e3 * step:.1f} ms | {1e3 * s['step']:.1f} ms | {_pct(step, s['step'])} | {src} (gpt2_dtr) |")
        rows.append(f"| {name} | 8 x 512 | DTR at 3.96 GiB (50 % of the peak): overhead, default heuristic | {at['overhead']:.3f} | {s['engine']:.3f} engine compute; {s['wall']:.2f}x wall | {_pct(at['overhead'], s['engine'])} (compute) | {src} (gpt2_dtr) |")
        ra = plan(512, 8, dev, (int(s["budget"]),), heuristic="auto")
        aa = next(v for v in ra["variants"] if v["variant"] == "dtr" and abs(v["budget_bytes"] - int(s["budget"])) < 1024)
        rows.append(f"| {name} | 8 x 512 | the same, auto policy (tuned on a first step, as the region runs) | {aa['overhead']:.3f} | {s['engine']:.3f} engine compute | {_pct(aa['overhead'], s['engine'])} (compute) | {src} (gpt2_dtr) |")
        if dev == "h100":
            p2 = M["s512_profile"]
            rows.append(f"| {name} | 8 x 512 | step time | {1e3 * step:.1f} ms | {1e3 * p2['step']:.1f} ms | {_pct(step, p2['step'])} | gpu-2026-11-27-h100-rerun.md (profile_step) |")
        else:
            p2 = M["s1024"]
            r2 = plan(1024, 8, dev, (int(p2["peak"] // 2),))
            pk2, st2 = r2["memory"]["peak_bytes"], r2["step_ns"] / 1e9
            half = next(v for v in r2["variants"] if v["variant"] == "dtr" and abs(v["ratio"] - 0.5) < 1e-6)
            rows.append(f"| {name} | 8 x 1024 | peak, no eviction | {_g(pk2)} | {_g(p2['peak'])} | {_pct(pk2, p2['peak'])} | gpu-2026-11-27-h200.md (profile_step) |")
            meas = sum(p2["step"]) / 2
            rows.append(f"| {name} | 8 x 1024 | step time | {1e3 * st2:.1f} ms | {1e3 * p2['step'][0]:.1f} / {1e3 * p2['step'][1]:.1f} ms | {_pct(st2, meas)} | gpu-2026-11-27-h200{{,-rerun}}.md (profile_step) |")
            ratio_b = [b / c for b, c in zip(p2["budget"], p2["card"])]
            rows.append(f"| {name} | 8 x 1024 | DTR at 50 % of the peak: overhead | {half['overhead']:.3f} | {p2['budget'][0]:.2f}x / {p2['budget'][1]:.2f}x wall; over the region without eviction ('card') {ratio_b[0]:.2f}x / {ratio_b[1]:.2f}x | {_pct(half['overhead'], sum(ratio_b) / 2)} (vs budget/card) | gpu-2026-11-27-h200{{,-rerun}}.md (profile_step) |")
        # native probes: predicted peak and step time at each measured batch
        for b, got in sorted(M["native"].items()):
            rb = plan(512, b, dev)
            usable = rb["devices"][0]["budget_bytes"]
            fits = rb["devices"][0]["fits_natively"]
            if got is None:
                batch_rows.append(f"| {name} | {b} | native | OOM | {'fits' if fits else 'does not fit'} ({_g(rb['memory']['peak_bytes'])} of {_g(usable)} usable) |")
            else:
                pk, st = got
                batch_rows.append(f"| {name} | {b} | native | fits, {_g(pk)}, {1e3 * st:.0f} ms | {'fits' if fits else 'does not fit'}, {_g(rb['memory']['peak_bytes'])} ({_pct(rb['memory']['peak_bytes'], pk)}), {rb['step_ns'] / 1e6:.0f} ms ({_pct(rb['step_ns'] / 1e9, st)}) |")
        probe_budget = int(0.95 * M["card"])
        for b, ok in sorted(M["memscale"].items()):
            rb = plan(512, b, dev, (probe_budget,))
            f = rb["budgets"][0]
            pred = "fits" if f["dtr_status"] == "ok" else f["dtr_status"]
            if f["dtr_status"] == "ok":
                pred += f" at {f['overhead']:.2f}x"
            batch_rows.append(f"| {name} | {b} | memscale, budget {_g(probe_budget)} (95 %) | {'fits' if ok else 'does not fit (budget)'} | {pred}; least budget {_g(rb['memory']['min_feasible_budget_bytes'])} |")
        # the largest batch the planner predicts: natively on the device's usable memory, and
        # under DTR at the probes' budget (within the planner's 2x overhead limit)
        usable = plan(512, 8, dev)["devices"][0]["budget_bytes"]
        big_native = _largest(lambda b: plan(512, b, dev)["memory"]["peak_bytes"] <= usable, 8, 1024)
        big_dtr = _largest(lambda b: plan(512, b, dev)["memory"]["min_feasible_budget_bytes"] <= probe_budget, 8, 2048)
        n_meas = max(b for b, v in M["native"].items() if v)
        n_fail = min(b for b, v in M["native"].items() if v is None)
        d_meas = max(b for b, v in M["memscale"].items() if v)
        d_fail = min(b for b, v in M["memscale"].items() if not v)
        rows.append(f"| {name} | x 512 | largest batch natively | {big_native} ({_g(usable)} usable) | {n_meas} fits, {n_fail} OOM | within the bracket: {'yes' if n_meas <= big_native < n_fail else 'no'} | {src} (gpt2_dtr probes) |")
        rows.append(f"| {name} | x 512 | largest batch under memscale (budget {_g(probe_budget)}) | {big_dtr} | {d_meas} fits, {d_fail} fails | within the bracket: {'yes' if d_meas <= big_dtr < d_fail else 'no'} | {src} (gpt2_dtr probes) |")
        notes.append(f"{name}: usable {_g(usable)} (device table), probe budget {_g(probe_budget)}")
    wall = time.perf_counter() - t_start
    lines = [
        GPU_SECTION,
        "",
        f"{time.strftime('%Y-%m-%d')}, planned on this machine ({platform.node()}, CPU, torch {torch.__version__}): "
        f"{plan.calls} plans in {wall:.0f} s.",
        "",
        "    PYTHONPATH=pytorch_plugin MEMSCALE_LIBRARY=$PWD/build/libmemscale.so HF_HUB_OFFLINE=1 \\",
        "        .venv/bin/python bench/planner_bench.py --gpu --out bench/results/planner.md",
        "",
        "Predicted: `memscale.plan(model, batch, SGD, device=\"meta\", cost_device=\"h100\"|\"h200\", target=...,",
        "budgets=[...])` of bench/gpu/gpt2_dtr.py's GPT-2 (124M, HF, eager attention, fp32, dropout off;",
        "`attention_mask` of ones added, see below), nothing run. Measured: the files named in the last column",
        "(torch 2.11, commits a5f1ccd and c523a99).",
        "",
        "| device | batch x seq | what | predicted | measured | error | measured in |",
        "|---|---|---|---:|---:|---:|---|",
        *rows,
        "",
        "Every probe of the GPU runs' batch searches, predicted:",
        "",
        "| device | batch | how | measured | predicted |",
        "|---|---:|---|---|---|",
        *batch_rows,
        "",
        "(" + "; ".join(notes) + ".)",
        "",
        GPU_END,
        "",
    ]
    return "\n".join(lines)


def write_section(path: Path, section: str, text: str | None, head: str | None) -> None:
    """Write ``path`` as ``head`` (or the file's part before ``section``) followed by
    ``text`` (or the file's part from ``section`` on, kept); a new ``text`` replaces
    the old one up to GPU_END, what follows GPU_END is kept."""
    old = path.read_text() if path.exists() else ""
    i = old.find(section)
    before, after = (old[:i], old[i:]) if i >= 0 else (old, "")
    head = head if head is not None else before
    if text is not None:
        j = after.find(GPU_END)
        kept = after[j + len(GPU_END):].lstrip("\n") if j >= 0 else ""
        text += "\n" + kept if kept else ""
    tail = text if text is not None else after
    path.write_text(head.rstrip("\n") + "\n\n" + tail if tail else head)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: see the docstring)")
    p.add_argument("--gpu", action="store_true", help="plan the GPU results' configurations instead (see the docstring)")
    args = p.parse_args()
    if args.gpu:
        with tempfile.TemporaryDirectory() as d:
            text = gpu_section(Path(d))
        print(text)
        if args.out:
            write_section(args.out, GPU_SECTION, text, None)
        return 0
    torch.set_num_threads(args.threads)
    load0 = os.getloadavg()
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
                cpu = memscale.plan(model, batch, opt, loss_fn, out=Path(d) / "cpu", ratios="0.5", heuristic="auto",
                                    repeats=REPEATS, overhead_limit=float("inf"), plot=False).plans[0]
                wall = time.perf_counter() - t0
            pred_peak = meta["memory"]["peak_bytes"]
            half = next(v for v in cpu["variants"] if v["variant"] == "dtr" and abs(v["ratio"] - 0.5) < 1e-6)
            peak = measured_peak(model, batch, loss_fn, opt)
            budget = int(0.5 * cpu["memory"]["trace_peak_bytes"])
            try:
                overs, choice, used, tuned = measured_overhead(model, batch, loss_fn, budget)
            except memscale.MemscaleError:  # the region refused the budget
                overs, choice, used, tuned = [], "refused", 0, float("nan")
            rows.append((name, b, pred_peak, peak, budget, half, overs, choice, tuned, wall))
            print(f"{name} b{b}: peak predicted {pred_peak / 2**20:.2f} MiB measured {peak / 2**20:.2f} MiB "
                  f"({100 * (pred_peak / peak - 1):+.1f} %); at {budget / 2**20:.2f} MiB predicted {half['status']} "
                  f"{half['overhead']:.3f} ({half['heuristic']}) measured {[round(o, 3) for o in overs]} ({choice}, tuner {tuned:.3f}, "
                  f"region peak {used / 2**20:.2f} MiB); plan {wall:.1f} s", flush=True)
    load1 = os.getloadavg()
    if args.out:
        lines = [
            "# memscale plan: predictions against this machine",
            "",
            f"{time.strftime('%Y-%m-%d')}, {platform.node()} ({platform.processor() or platform.machine()}, CPU, "
            f"{os.cpu_count()} cores shared with other jobs; load average {load0[0]:.2f} at the start, "
            f"{load1[0]:.2f} at the end), torch {torch.__version__}, {args.threads} thread(s).",
            "",
            "    PYTHONPATH=pytorch_plugin MEMSCALE_LIBRARY=$PWD/build/libmemscale.so HF_HUB_OFFLINE=1 \\",
            "        .venv/bin/python bench/planner_bench.py --out bench/results/planner.md",
            "",
            "Predicted peak: `memscale.plan(..., device=\"meta\")` (nothing run; Adam's state and step from a meta copy).",
            "Measured peak: a plain step's (forward, backward, `optimizer.step()`) on the CPU allocator, torch.profiler.",
            "Overhead at 50 % of the step's peak (the budget column): predicted by `memscale.plan(..., heuristic=\"auto\",",
            f"repeats={REPEATS}, overhead_limit=math.inf)` (the step recorded {REPEATS} times on the CPU, each op's median time, replayed as",
            "the region runs it: its engine configuration, rebuilds and pinned gradients, a first step tuned, the",
            "configuration chosen; no overhead limit, as the region has none);",
            f"measured: `memscale.dtr(budget)` for {STEPS} steps, the first records and tunes, the median of the other",
            f"{STEPS - 1} steps' `(base + remat) / base` of their own measured op costs (range in brackets). In brackets after",
            "each overhead: the configuration chosen. \"refuses\": the planner's replay of the region's first step runs",
            "out of budget (its status in brackets) / the region raised.",
            "",
            "The engine's own prediction: the overhead the region's tuning computed for its choice (the engine's replay of",
            "the first step's recording, with that step's measured op costs), against the same measured median.",
            "",
            "| model | batch | peak predicted | peak measured | error | budget | overhead predicted | measured | error | engine's own prediction (error) | plan wall |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        agree = within = ran = 0
        for name, b, pp, mp, budget, half, overs, choice, tuned, wall in rows:
            if half["status"] == "ok":
                pred = f"{half['overhead']:.3f} ({_policy(half['heuristic'])})"
            else:
                pred = f"refuses ({half['status']})"
            if len(overs) < STEPS and overs:
                med, meas = float("nan"), choice
            elif overs:
                med = statistics.median(overs[1:])
                meas = f"{med:.3f} ({choice}; {min(overs[1:]):.3f}-{max(overs[1:]):.3f})"
            else:
                med, meas = float("nan"), "refuses"
            if half["status"] == "ok" and len(overs) == STEPS:
                ran += 1
                err = 100 * (half["overhead"] / med - 1)
                within += abs(err) <= 10
                cell = f"{err:+.1f} %"
            elif half["status"] != "ok" and not overs:
                agree += 1
                cell = "both refuse"
            else:
                cell = "disagree"
            own = f"{tuned:.3f} ({100 * (tuned / med - 1):+.1f} %)" if tuned == tuned and med == med else "-"
            lines.append(f"| {name} | {b} | {pp / 2**20:.2f} MiB | {mp / 2**20:.2f} MiB | {100 * (pp / mp - 1):+.1f} % | "
                         f"{budget / 2**20:.2f} MiB | {pred} | {meas} | {cell} | {own} | {wall:.1f} s |")
        lines += ["", f"Overhead: {within} of the {ran} cells both ran within 10 %; {agree} cells where both refuse.", ""]
        write_section(args.out, GPU_SECTION, None, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
