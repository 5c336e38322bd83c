#!/usr/bin/env python3
"""Block-level DTR (memscale.blocks) against activation checkpointing and the
op-level region, on plugin_bench's GPT-2 (CPU; 4 layers, width 256, batch 8 x 128).

Runs, each on its own copy of the same weights, taking turns step by step in
one process (medians over steps 3..N, wall time):

* ``plain``: no memscale;
* ``checkpointing``: Hugging Face ``gradient_checkpointing_enable`` (PyTorch's
  non-reentrant ``torch.utils.checkpoint`` around every block): the memory
  reference users compare with;
* ``blocks F``: ``memscale.blocks(model, F)`` for F of the blocks' activations
  (the first step measures them);
* ``region F``: ``memscale.dtr`` at F of the step's peak (op-level DTR).

Memory: each run's peak of the bytes malloc hands out during one step over what
it held before (glibc's ``mallinfo2``, sampled after every op by a dispatch
mode: activations, gradients and temporaries, not the weights), measured in a
separate step after the timed ones, for every run but the region's (whose
engine reports its own peak). Losses and gradients are compared bitwise with ``plain``.

    OMP_NUM_THREADS=1 MEMSCALE_LIBRARY=build/libmemscale.so HF_HUB_OFFLINE=1 \\
        .venv/bin/python bench/blocks_bench.py --markdown bench/results/blocks.md
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pytorch_plugin"))

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import memscale  # noqa: E402
from memscale import dtr  # noqa: E402
from memscale.config import format_bytes  # noqa: E402

from plugin_bench import _gpt2, _gpt2_step, _step_peak  # noqa: E402


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")
    ]


def _malloc_in_use() -> Any:
    """``() -> bytes malloc has handed out`` (glibc's mallinfo2: arena + mmapped
    blocks, where CPU tensors live), or ``None`` where there is no mallinfo2."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallinfo2 = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    mallinfo2.restype = _MallInfo2

    def in_use() -> int:
        m = mallinfo2()
        return int(m.uordblks + m.hblkhd)

    return in_use


class MallocPeak(TorchDispatchMode):
    """Peak of the bytes malloc has handed out, sampled after every op, over
    what was in use when the mode was entered. Counts what the process really
    holds (a storage's Python object can die while its memory lives on, so
    counting storages by their objects' lifetimes undercounts)."""

    def __init__(self, in_use: Any) -> None:
        super().__init__()
        self.in_use = in_use
        self.base = in_use()
        self.peak = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.peak = max(self.peak, self.in_use() - self.base)
        return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=9, help="steps per run (the first two are not timed)")
    p.add_argument("--markdown", help="write the results to this Markdown file")
    args = p.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    make, ids = _gpt2()
    step = _gpt2_step(ids)
    peak = _step_peak(make, step)
    runs: list[dict[str, Any]] = [{"name": "plain"}, {"name": "checkpointing", "ckpt": True}]
    for f in ("100%", "50%", "25%"):
        runs.append({"name": f"blocks {f}", "blocks": f})
    for f in (0.5, 0.25):
        runs.append({"name": f"region {f:.0%}", "region": dtr(int(peak * f))})
    for r in runs:
        model = make()
        if r.get("ckpt"):
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if r.get("blocks"):
            r["tracker"] = memscale.blocks(model, r["blocks"])
        r.update(model=model, times=[], losses=[], error=None)
    started = time.time()
    for i in range(args.steps):
        for r in runs:
            if r["error"] is not None:
                continue
            try:
                dt, _, loss = step(r["model"], r.get("region"), i)
            except memscale.MemscaleError as exc:
                r["error"] = str(exc).splitlines()[0][:200]
                continue
            r["times"].append(dt)
            r["losses"].append(loss)
            r["grads"] = [p.grad.clone() for p in r["model"].parameters()]
    base = statistics.median(runs[0]["times"][2:])
    for r in runs:
        if r["error"] is None:
            r["median"] = statistics.median(r["times"][2:])
            r["ratio"] = r["median"] / base
            r["bitwise"] = all(torch.equal(a, b) for a, b in zip(runs[0]["losses"], r["losses"])) and all(
                torch.equal(a, b) for a, b in zip(runs[0]["grads"], r["grads"])
            )
        in_use = _malloc_in_use()
        if "region" not in r and r["error"] is None and in_use is not None:
            r["model"].zero_grad(set_to_none=True)
            mode = MallocPeak(in_use)
            with mode:
                step(r["model"], None, args.steps)
            r["live_peak"] = mode.peak
    elapsed = time.time() - started
    lines = table(runs, peak)
    cmd = "OMP_NUM_THREADS=1 MEMSCALE_LIBRARY=build/libmemscale.so HF_HUB_OFFLINE=1 .venv/bin/python bench/blocks_bench.py"
    text = "\n".join(
        [
            "# Block-level DTR against checkpointing and the op-level region (CPU, GPT-2)",
            "",
            f"Date: {datetime.date.today()}, {platform.node()}, torch {torch.__version__}, "
            f"{torch.get_num_threads()} intra-op thread(s), load average {os.getloadavg()[0]:.2f} at the end; "
            f"{args.steps} steps per run taking turns, medians of steps 3..{args.steps}; {elapsed:.0f} s.",
            "",
            f"    {cmd}",
            "",
            *lines,
        ]
    )
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
        print(f"wrote {args.markdown}")
    return 0


def table(runs: list[dict[str, Any]], peak: int) -> list[str]:
    """The results as a Markdown table."""
    out = [
        f"GPT-2 step (4 layers, width 256, batch 8 x 128); the region's step peak {format_bytes(peak)}.",
        "",
        "| run | step s | / plain | compute overhead (1 + recompute / plain step) | / plain - compute overhead "
        "| step's memory peak (malloc) "
        "| blocks budget | evictions | recomputes | bitwise | error |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    base = runs[0]["median"]
    for r in runs:
        if r["error"] is not None:
            out.append(f"| {r['name']} | - | - | - | - | - | - | - | - | - | {r['error']} |")
            continue
        budget = evictions = remats = share = rest = "-"
        s = {}
        if "tracker" in r:
            s = r["tracker"].summary()
            budget, evictions, remats = format_bytes(s["budget"]), s["evictions"], s["rematerializations"]
        elif "region" in r:
            s = r["region"].summary()
            evictions, remats = s["evictions"], s["rematerializations"]
        if s.get("remat_cost_ns") is not None:
            # Recompute time per step run (the memory step of blocks included),
            # as a share of the plain step: what the issue calls compute overhead.
            steps_run = len(r["times"]) + (1 if "live_peak" in r else 0)
            recompute = s["remat_cost_ns"] / 1e9 / steps_run / base
            share, rest = f"{1 + recompute:.3f}", f"{r['ratio'] - 1 - recompute:+.2f}"
        live = format_bytes(r["live_peak"]) if "live_peak" in r else "-"
        out.append(
            f"| {r['name']} | {r['median']:.3f} | {r['ratio']:.2f} | {share} | {rest} | {live} | {budget} | {evictions} | {remats} "
            f"| {'yes' if r['bitwise'] else 'NO'} | |"
        )
    return out


if __name__ == "__main__":
    raise SystemExit(main())
