#!/usr/bin/env python3
"""The native region against the Python region and plain PyTorch, on the CPU.

Side by side in one process (runs take turns, medians):

1. Per-op cost with no evictions: ``2 n`` small ops on a 16x16 tensor, plain,
   under an empty ``TorchDispatchMode``, and in ``memscale.dtr(None)``
   (unbudgeted) and ``memscale.dtr(1 TiB)`` (the budgeted path, no eviction)
   on the Python path (``MEMSCALE_NATIVE=0``) and on the native path
   (``MEMSCALE_NATIVE=1``). Process CPU time per op.
2. A GPT-2 training step (4 layers, width 256, batch 8 x 128; forward +
   backward, seeded): plain; Hugging Face gradient checkpointing; memscale at
   100 %, 50 % and 30 % of the step's peak on both paths, and on the native
   path at checkpointing's peak. The runs take turns, one step each per
   round. Reported: median wall time (first step skipped), the ratio to plain
   (the median of each round's ratio to plain's step in that round), the
   engine's compute overhead, and whether the losses and gradients are bitwise
   the plain run's.

Usage (from the repository root, with the library built):

    MEMSCALE_LIBRARY=build/libmemscale.so HF_HUB_OFFLINE=1 \\
        .venv/bin/python bench/native_bench.py --markdown bench/results/native-region.md
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pytorch_plugin"))

import torch  # noqa: E402
import memscale  # noqa: E402
from plugin_bench import EmptyMode, op_loop  # noqa: E402  (bench/ is on sys.path: the script's directory)




@contextlib.contextmanager
def native(on: bool | None) -> Iterator[None]:
    """``MEMSCALE_NATIVE`` for the block (None: unset)."""
    old = os.environ.get("MEMSCALE_NATIVE")
    if on is None:
        os.environ.pop("MEMSCALE_NATIVE", None)
    else:
        os.environ["MEMSCALE_NATIVE"] = "1" if on else "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("MEMSCALE_NATIVE", None)
        else:
            os.environ["MEMSCALE_NATIVE"] = old


def per_op(reps: int, n: int) -> dict[str, float]:
    loop = op_loop(n)
    regions = {
        "python, unbudgeted": (False, memscale.dtr(None)),
        "python, budgeted": (False, memscale.dtr(1 << 40)),
        "native, unbudgeted": (True, memscale.dtr(None)),
        "native, budgeted": (True, memscale.dtr(1 << 40)),
    }

    def in_region(on: bool, region: Any) -> None:
        with native(on), region:
            loop()

    def in_mode() -> None:
        with EmptyMode():
            loop()

    runs: dict[str, Any] = {"plain": loop, "empty TorchDispatchMode": in_mode}
    for name, (on, region) in regions.items():
        runs[name] = lambda on=on, region=region: in_region(on, region)
    times: dict[str, list[float]] = {k: [] for k in runs}
    for fn in runs.values():
        fn()
    for _ in range(reps):
        for name, fn in runs.items():
            t0 = time.process_time_ns()
            fn()
            times[name].append((time.process_time_ns() - t0) / (2 * n))
    for name, (on, region) in regions.items():
        assert region.summary()["evictions"] == 0, name
    return {k: statistics.median(v) for k, v in times.items()}


def gpt2() -> tuple[Any, Any, Any]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    transformers.logging.set_verbosity_error()
    cfg = transformers.GPT2Config(n_layer=4, n_embd=256, n_head=4, n_positions=128, vocab_size=2048)
    torch.manual_seed(0)
    init = transformers.GPT2LMHeadModel(cfg).state_dict()
    ids = torch.randint(0, cfg.vocab_size, (8, 128), generator=torch.Generator().manual_seed(1))

    def make(checkpointing: bool = False) -> Any:
        m = transformers.GPT2LMHeadModel(cfg)
        m.load_state_dict(init)
        m.train()
        if checkpointing:
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return m

    def step(model: Any, region: Any, on: bool | None, i: int) -> tuple[float, Any]:
        model.zero_grad(set_to_none=True)
        torch.manual_seed(100 + i)
        t0 = time.perf_counter()
        with native(on), (region if region is not None else contextlib.nullcontext()):
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
        wall = time.perf_counter() - t0
        out = [loss.detach().clone()] + [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]
        return wall, out

    return make, step, ids


def peak_of(make: Any, step: Any, checkpointing: bool, on: bool = False) -> int:
    """The step's peak as the Python (``on`` False) or the native region counts it."""
    free = memscale.dtr(None)
    m = make(checkpointing)
    for i in range(2):
        step(m, free, on, i)
    return int(free.summary()["peak_usage"])


def gpt2_steps(steps: int) -> tuple[int, int, list[dict[str, Any]]]:
    make, step, _ = gpt2()
    # Each path's budgets are fractions of the peak it counts itself (the
    # native region counts a few tens of KiB more: autograd accumulates
    # gradients out of place into wrappers), so 100 % means no eviction needed
    # on either path.
    peaks = {on: peak_of(make, step, False, on) for on in (False, True)}
    ckpt_peak = peak_of(make, step, True)
    runs: list[dict[str, Any]] = [
        {"name": "plain", "model": make(), "region": None, "on": None},
        {"name": "HF gradient checkpointing", "model": make(True), "region": None, "on": None},
    ]
    for f in (1.0, 0.5, 0.3):
        for on in (False, True):
            runs.append(
                {
                    "name": f"{'native' if on else 'python'} region at {f:.0%} of the peak",
                    "model": make(),
                    "region": memscale.dtr(int(peaks[on] * f)),
                    "on": on,
                    "budget": int(peaks[on] * f),
                }
            )
    runs.append(
        {
            "name": "native region at checkpointing's peak",
            "model": make(),
            "region": memscale.dtr(ckpt_peak),
            "on": True,
            "budget": ckpt_peak,
        }
    )
    for r in runs:
        r["times"], r["outs"], r["error"] = [], [], None
    for i in range(steps):
        for r in runs:
            if r["error"]:
                continue
            try:
                dt, out = step(r["model"], r["region"], r["on"], i)
            except Exception as exc:  # noqa: BLE001 - a run that fails is reported, not fatal
                r["error"] = str(exc).splitlines()[0][:160]
                continue
            r["times"].append(dt)
            r["outs"].append(out)
    plain = runs[0]["times"]
    for r in runs:
        if r["error"] or len(r["times"]) < 2:
            continue
        r["median"] = statistics.median(r["times"][1:])
        # Paired: each round's step against plain's in the same round (the
        # runs take turns), so the machine's drift between rounds cancels.
        r["ratio"] = statistics.median(t / b for t, b in zip(r["times"][1:], plain[1:]))
        r["bitwise"] = all(
            len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b)) for a, b in zip(runs[0]["outs"], r["outs"])
        )
        if r["region"] is not None:
            s = r["region"].summary()
            r["overhead"] = s["overhead"]
            r["evictions"] = s["evictions"]
            r["peak_usage"] = s["peak_usage"]
    keep = ("name", "error", "median", "ratio", "bitwise", "overhead", "evictions", "peak_usage")
    return peaks, ckpt_peak, [{k: r[k] for k in keep if k in r} for r in runs]


def gpt2_in_processes(steps: int, processes: int) -> tuple[dict[bool, int], int, list[dict[str, Any]]]:
    """``gpt2_steps`` in ``processes`` fresh processes, one after another: how a
    step's memory lands (the CPU allocator's heap, page faults) differs between
    processes more than between the rounds of one, so each row reports the
    median over processes of each process's ratio, with the lowest and highest."""
    results = []
    for _ in range(processes):
        child = subprocess.run(
            [sys.executable, __file__, "--gpt2-child", "--steps", str(steps)],
            check=True,
            capture_output=True,
            text=True,
        )
        results.append(json.loads(child.stdout.strip().splitlines()[-1]))
    peaks = {False: results[0]["peaks"]["python"], True: results[0]["peaks"]["native"]}
    runs: list[dict[str, Any]] = []
    for i, first in enumerate(results[0]["runs"]):
        rows = [res["runs"][i] for res in results]
        errors = [r["error"] for r in rows if r.get("error")]
        if errors or any("ratio" not in r for r in rows):
            runs.append({"name": first["name"], "error": errors[0] if errors else "too few steps"})
            continue
        row: dict[str, Any] = {
            "name": first["name"],
            "median": statistics.median(r["median"] for r in rows),
            "ratio": statistics.median(r["ratio"] for r in rows),
            "ratio_range": (min(r["ratio"] for r in rows), max(r["ratio"] for r in rows)),
            "bitwise": all(r["bitwise"] for r in rows),
        }
        if "overhead" in first:
            row["overhead"] = statistics.median(r["overhead"] for r in rows)
            row["net_range"] = (min(r["ratio"] - r["overhead"] for r in rows), max(r["ratio"] - r["overhead"] for r in rows))
            row["evictions"] = int(statistics.median(r["evictions"] for r in rows))
            row["peak_usage"] = max(r["peak_usage"] for r in rows)
        runs.append(row)
    return peaks, results[0]["ckpt"], runs


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--ops", type=int, default=1000)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--markdown")
    p.add_argument("--threads", type=int, default=1, help="torch's intra-op threads (1: no spinning OpenMP workers)")
    p.add_argument(
        "--processes", type=int, default=1, help="run the GPT-2 part in this many fresh processes (medians over them)"
    )
    p.add_argument("--gpt2-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.gpt2_child:
        peaks, ckpt, runs = gpt2_steps(args.steps)
        print(json.dumps({"peaks": {"python": peaks[False], "native": peaks[True]}, "ckpt": ckpt, "runs": runs}))
        return 0
    ops = per_op(args.reps, args.ops)
    plain = ops["plain"]
    lines = [
        f"# The native region against the Python region ({datetime.date.today()})",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}. Command: "
        "`MEMSCALE_LIBRARY=build/libmemscale.so HF_HUB_OFFLINE=1 .venv/bin/python bench/native_bench.py "
        f"--reps {args.reps} --ops {args.ops} --steps {args.steps} --threads {args.threads} "
        f"--processes {args.processes} --markdown ...` (one run; medians).",
        "",
        "## Per op (16x16 add and mul, no eviction; process CPU time)",
        "",
        "| run | us/op | over plain |",
        "|---|---:|---:|",
    ]
    for name, ns in ops.items():
        lines.append(f"| {name} | {ns / 1000:.2f} | {(ns - plain) / 1000:+.2f} us |")
    print("\n".join(lines), flush=True)
    if args.processes > 1:
        peaks, ckpt, runs = gpt2_in_processes(args.steps, args.processes)
    else:
        peaks, ckpt, runs = gpt2_steps(args.steps)
    spread = args.processes > 1
    lines += [
        "",
        f"## GPT-2 step (4 layers, width 256, batch 8 x 128; peak {peaks[False] / 2**20:.2f} MiB as the Python "
        f"region counts it, {peaks[True] / 2**20:.2f} MiB as the native one does (each path's budgets are "
        f"fractions of its own); with HF gradient checkpointing {ckpt / 2**20:.1f} MiB)",
        "",
        "| run | median step | ratio to plain (paired) | compute overhead | wall ratio - overhead | evictions | peak | bitwise |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    if spread:
        lines.insert(-2, f"Medians over {args.processes} fresh processes (lowest-highest in brackets).\n")
    for r in runs:
        if r.get("error"):
            lines.append(f"| {r['name']} | failed: {r['error']} | | | | | | |")
            continue
        oh = r.get("overhead")
        over = "" if oh is None else f"{oh:.3f}x"
        net = "" if oh is None else f"{r['ratio'] - oh:+.3f}"
        peak_used = "" if r.get("peak_usage") is None else f"{r['peak_usage'] / 2**20:.1f} MiB"
        ratio = f"{r['ratio']:.3f}x"
        if "ratio_range" in r:
            ratio += f" ({r['ratio_range'][0]:.3f}-{r['ratio_range'][1]:.3f})"
        if "net_range" in r:
            net += f" ({r['net_range'][0]:+.3f}..{r['net_range'][1]:+.3f})"
        lines.append(
            f"| {r['name']} | {r['median'] * 1000:.1f} ms | {ratio} | {over} | {net} | "
            f"{r.get('evictions', '')} | {peak_used} | {'yes' if r['bitwise'] else 'NO'} |"
        )
    text = "\n".join(lines) + "\n"
    print("\n".join(lines[-len(runs) - 4 :]))
    if args.markdown:
        Path(args.markdown).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
