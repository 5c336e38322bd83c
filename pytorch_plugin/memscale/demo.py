"""memscale demo: train GPT-2 under half of its peak memory.

``python -m memscale.demo`` (``make demo``) trains a small GPT-2 (random weights,
no download) for a few steps three times from the same initial weights:

1. plainly (the reference losses and step time);
2. through an unbudgeted DTR region (ops recorded, nothing evicted): the
   step's peak memory as the engine counts it;
3. under a budget of 50 % of that peak: the engine evicts and rematerializes.

and prints both peaks, the budget, the evictions and rematerializations, the
compute overhead (``(base + remat) / base`` of the engine's measured op costs),
the wall-clock step-time ratio, and whether the losses were bitwise identical.

On a machine with a GPU the memscale allocator is installed first (before CUDA
is initialized) and the engine counts the allocator's allocated bytes; otherwise
the model runs on the CPU and usage is the sum of resident tensor bytes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

from .config import format_bytes


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m memscale.demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=5, help="training steps per run (default 5)")
    p.add_argument("--fraction", type=float, default=0.5, help="budget as a fraction of the peak (default 0.5)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--heuristic", default=None, help="engine heuristic (default: the engine's)")
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error(f"--steps {args.steps}: need at least 1")
    if not 0 < args.fraction <= 1:
        p.error(f"--fraction {args.fraction}: must be in (0, 1]")
    return args


def _path_line(region: Any) -> str:
    """Which per-op path the region ran on, and why when not the native one."""
    if region.native:
        return "native (the per-op path in C++)"
    from ._native import region_ext

    why = region_ext.unavailable_reason()
    return "Python" + (f" ({why})" if why else " (MEMSCALE_NATIVE=0)")


def _tuning_line(tuning: dict[str, Any] | None) -> str:
    """The engine's choice at the end of step 1, as the demo prints it."""
    if not tuning:
        return "no (explicit heuristic)"
    if "error" in tuning:
        return f"failed: {tuning['error']}"
    return (
        f"{tuning['choice']} in {tuning['wall_ns'] / 1e6:.0f} ms (replayed overhead "
        f"{tuning['overhead']:.3f} vs {tuning['default_overhead']:.3f} for the default heuristic)"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the demo; returns the process exit status."""
    args = _parse(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if cuda:
        import memscale

        # Before anything touches CUDA: PyTorch can only swap its allocator first.
        memscale.install()
    import transformers

    from ._region import dtr

    transformers.logging.set_verbosity_error()
    device = torch.device("cuda" if cuda else "cpu")
    cfg = transformers.GPT2Config(
        n_layer=args.layers,
        n_embd=args.width,
        n_head=args.heads,
        vocab_size=args.vocab,
        n_positions=args.seq,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg)
    init = {k: v.clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, args.vocab, (args.batch, args.seq), generator=g).to(device) for _ in range(args.steps)]
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"memscale demo: GPT-2 {args.layers} layers, width {args.width}, {n_params / 1e6:.1f} M parameters, "
        f"batch {args.batch} x {args.seq} tokens, {args.steps} steps on {'CUDA (memscale allocator)' if cuda else 'CPU'}",
        flush=True,
    )

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def allocated_peak() -> int:
        import memscale

        return memscale.max_memory_allocated(device)

    def reset_peak() -> None:
        if cuda:
            import memscale

            memscale.reset_peak_memory_stats(device)

    class Run:
        """One training run: its own copy of the model and optimizer."""

        def __init__(self, region: Any) -> None:
            self.model = transformers.GPT2LMHeadModel(cfg).to(device)
            self.model.load_state_dict(init)
            self.model.train()
            self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
            self.region = region
            self.losses: list[Any] = []
            self.times: list[float] = []

        def step(self, i: int) -> None:
            ids = batches[i]
            self.opt.zero_grad(set_to_none=True)
            torch.manual_seed(100 + i)
            sync()
            t0 = time.perf_counter()
            if self.region is None:
                loss = self.model(input_ids=ids, labels=ids).loss
                loss.backward()
            else:
                with self.region:
                    loss = self.model(input_ids=ids, labels=ids).loss
                    loss.backward()
                loss = self.region.unwrap(loss)
            sync()
            self.times.append(time.perf_counter() - t0)
            self.opt.step()  # after the region: plain tensors, plain optimizer
            self.losses.append(loss.detach().clone())

    t_start = time.perf_counter()
    del model
    free = Run(dtr(None))
    reset_peak()
    for i in range(args.steps):
        free.step(i)
    free_times = free.times
    # On CUDA the engine counts the allocator's allocated bytes (everything on
    # the device, optimizer state included): budget against that peak.
    peak = allocated_peak() if cuda else free.region.summary()["peak_usage"]
    del free
    budget = max(1, int(peak * args.fraction))
    region = dtr(budget, heuristic=args.heuristic)
    dtr_peak = 0
    if cuda:
        # The engine counts everything allocated on the device: one model at a time.
        plain = Run(None)
        for i in range(args.steps):
            plain.step(i)
        ref_losses, ref_times = plain.losses, plain.times
        del plain
        run = Run(region)
        reset_peak()
        for i in range(args.steps):
            run.step(i)
        dtr_peak = allocated_peak()
    else:
        plain, run = Run(None), Run(region)
        for i in range(args.steps):  # side by side, so load changes hit both alike
            plain.step(i)
            run.step(i)
        ref_losses, ref_times = plain.losses, plain.times
    losses, times = run.losses, run.times
    s = region.summary()
    if cuda:
        s["peak_usage"] = dtr_peak
    same = all(torch.equal(a, b) for a, b in zip(ref_losses, losses))
    # the first step carries one-time costs; compare the rest when there is one
    skip = 1 if args.steps > 1 else 0
    ratio = statistics.median(times[skip:]) / statistics.median(ref_times[skip:])
    rows = [
        ("baseline peak (no budget)", format_bytes(peak)),
        (f"budget ({args.fraction:.0%} of peak)", format_bytes(budget)),
        ("peak under DTR", f"{format_bytes(s['peak_usage'])} ({s['peak_usage'] / peak:.0%} of baseline)"),
        ("evictions", f"{s['evictions']}"),
        ("rematerializations", f"{s['rematerializations']}"),
        ("compute overhead", f"{s['overhead']:.3f}x (recomputed {s['remat_cost_ns'] / 1e6:.0f} ms of {s['base_cost_ns'] / 1e6:.0f} ms)"),
        ("tuned after step 1", _tuning_line(s.get("tuning"))),
        ("step time", f"{statistics.median(times[skip:]):.3f} s vs {statistics.median(ref_times[skip:]):.3f} s plain ({ratio:.2f}x)"),
        ("unbudgeted region step", f"{statistics.median(free_times[skip:]):.3f} s (op recording only)"),
        ("region path", _path_line(region)),
        ("losses", ", ".join(f"{float(x):.4f}" for x in losses) + ("  (bitwise equal to plain)" if same else "  (DIFFER from plain!)")),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")
    print(f"done in {time.perf_counter() - t_start:.1f} s", flush=True)
    if not same:
        print("memscale demo: FAILED (the losses differ from the plain run's)", file=sys.stderr)
        return 1
    if s["peak_usage"] > budget:
        if not cuda:  # the engine's own count must stay under the budget
            print("memscale demo: FAILED (the budget was exceeded)", file=sys.stderr)
            return 1
        # The allocator's peak also sees kernel workspaces between two evictions.
        print("  note: the allocator's peak includes transient kernel workspaces above the budget")
    return 0


if __name__ == "__main__":
    sys.exit(main())
