#!/usr/bin/env python3
"""One DTR region around a whole training run: GPT-2 with AdamW inside, N steps.

Measures what the issue asks of a whole-run region: losses and final parameters
bitwise equal to the same run without memscale; step time late in the run
against early in the run (median of steps 450-500 against 50-100 by default);
the engine's graph (ops, tensors of each step's engine) and the process's
resident memory (RSS) over the run.

    MEMSCALE_LIBRARY=build/libmemscale.so HF_HUB_OFFLINE=1 \\
        .venv/bin/python bench/whole_run_bench.py --steps 500 --markdown bench/results/whole-run.md

The budget is a fraction (--fraction, default 0.5) of the step's peak, measured
by an unbudgeted whole-run region over 2 steps (optimizer state included).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pytorch_plugin"))

import psutil  # noqa: E402
import torch  # noqa: E402

from memscale import dtr, unwrap  # noqa: E402
from memscale.config import format_bytes  # noqa: E402


def _setup() -> tuple[Any, Any]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    transformers.logging.set_verbosity_error()
    config = transformers.GPT2Config(n_layer=2, n_embd=128, n_head=4, n_positions=64, vocab_size=512)
    torch.manual_seed(0)
    init = transformers.GPT2LMHeadModel(config).state_dict()

    def make() -> tuple[Any, Any]:
        model = transformers.GPT2LMHeadModel(config)
        model.load_state_dict(init)
        model.train()
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3)

    def batch(i: int) -> Any:
        return torch.randint(0, config.vocab_size, (8, 64), generator=torch.Generator().manual_seed(i))

    return make, batch


def run(make: Any, batch: Any, steps: int, region: Any = None) -> dict[str, Any]:
    """``steps`` training steps, in one region when ``region`` is given."""
    model, optimizer = make()
    proc = psutil.Process()
    out: dict[str, Any] = {"times": [], "losses": [], "ops": [], "tensors": [], "rss": {}}
    torch.manual_seed(1)
    with region if region is not None else contextlib.nullcontext():
        for i in range(steps):
            ids = batch(i)
            t0 = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            out["times"].append(time.perf_counter() - t0)
            out["losses"].append(unwrap(loss).detach().clone())
            if region is not None:
                engine = region.last_summary()["engine"]
                out["ops"].append(int(engine["ops"]))
                out["tensors"].append(int(engine["tensors"]))
            if (i + 1) % 50 == 0:
                out["rss"][i + 1] = proc.memory_info().rss
    out["params"] = [p.detach().clone() for p in model.parameters()]
    return out



def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--fraction", type=float, default=0.5)
    p.add_argument("--markdown", type=Path)
    args = p.parse_args()
    make, batch = _setup()
    probe = dtr(None)
    run(make, batch, 2, probe)
    peak = int(probe.summary()["peak_usage"])
    budget = int(peak * args.fraction)
    t0 = time.perf_counter()
    plain = run(make, batch, args.steps)
    region = dtr(budget)
    got = run(make, batch, args.steps, region)
    wall = time.perf_counter() - t0
    bitwise = all(torch.equal(a, b) for a, b in zip(plain["losses"], got["losses"], strict=True)) and all(
        torch.equal(a, b) for a, b in zip(plain["params"], got["params"], strict=True)
    )
    n = args.steps
    early = slice(min(50, n // 10), min(100, n // 5))
    late = slice(n - max(50, n // 10), n)

    def med(times: list[float], s: slice) -> float:
        return statistics.median(times[s])

    s = region.summary()
    rows = [
        f"| budget | {format_bytes(budget)} ({args.fraction:.0%} of the step's {format_bytes(peak)} peak) |",
        f"| losses and final parameters bitwise equal to plain | {'yes' if bitwise else 'NO'} |",
        f"| engine peak usage | {format_bytes(s['peak_usage'])} |",
        f"| evictions / rematerializations | {s['evictions']} / {s['rematerializations']} |",
        f"| compute overhead | {s['overhead']:.3f} |",
        f"| median step, steps {early.start}-{early.stop} (region / plain) | {med(got['times'], early) * 1e3:.1f} ms / "
        f"{med(plain['times'], early) * 1e3:.1f} ms |",
        f"| median step, steps {late.start}-{late.stop} (region / plain) | {med(got['times'], late) * 1e3:.1f} ms / "
        f"{med(plain['times'], late) * 1e3:.1f} ms |",
        f"| late / early, region | {med(got['times'], late) / med(got['times'], early):.3f} |",
        f"| late / early, plain | {med(plain['times'], late) / med(plain['times'], early):.3f} |",
        f"| engine ops per step, steps 2-{n} (min / max) | {min(got['ops'][1:])} / {max(got['ops'][1:])} |",
        f"| engine tensors per step, steps 2-{n} (min / max) | {min(got['tensors'][1:])} / {max(got['tensors'][1:])} |",
        "| process RSS at step " + ", ".join(str(k) for k in got["rss"]) + ", region | "
        + ", ".join(f"{v / 2**20:.0f}" for v in got["rss"].values()) + " MiB |",
        "| the same, plain (run first) | " + ", ".join(f"{v / 2**20:.0f}" for v in plain["rss"].values()) + " MiB |",
    ]
    text = f"""# A whole training run in one DTR region

Date: {datetime.date.today().isoformat()}. {os.cpu_count()} CPU cores, no GPU; torch {torch.__version__}.
GPT-2 (2 layers, width 128, 4 heads, vocabulary 512, batch 8 x 64 tokens, dropout on) with
AdamW inside one `with memscale.dtr(budget):` for {n} steps, against the same {n} steps without
memscale (run first, in the same process). Every optimizer step ends a step of the region
(a fresh engine; the update runs outside DTR). Wall time of both runs: {wall:.0f} s.

    MEMSCALE_LIBRARY=build/libmemscale.so HF_HUB_OFFLINE=1 .venv/bin/python bench/whole_run_bench.py \\
        --steps {n} --fraction {args.fraction}{' --markdown ' + str(args.markdown) if args.markdown else ''}

| what | result |
|---|---|
{chr(10).join(rows)}
"""
    print(text)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text)
    return 0 if bitwise else 1


if __name__ == "__main__":
    raise SystemExit(main())
