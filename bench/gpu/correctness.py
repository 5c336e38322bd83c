"""Same numbers with PyTorch's allocator and with memscale's (and under DTR).

Run mode (one process per allocator; PyTorch takes a pluggable allocator only
once per process and only before CUDA is initialized)::

    correctness.py --allocator native   --save W/native.pt   --out native.json
    correctness.py --allocator memscale --save W/memscale.pt --out memscale.json
    correctness.py --allocator memscale --dtr-fraction 0.6 --native-json native.json \\
                   --save W/dtr.pt --out dtr.json

Each run seeds everything, builds a small MLP and a chain of matrix products on
CUDA (weights made on the CPU from a fixed seed, then moved), first allocates and
reduces scratch tensors of 512 B .. 256 MiB, then runs three training iterations
(forward, backward, a plain SGD update) and saves the losses, the last
gradients and the final parameters to a .pt file. With ``--dtr-fraction`` the
forward and backward passes run inside ``memscale.dtr(budget=fraction x the
native run's peak allocated bytes)``.

Compare mode (no GPU needed)::

    correctness.py --compare W/native.pt W/memscale.pt W/dtr.pt --out compare.json

reports, for each file against the first, whether losses, gradients and
parameters are bitwise equal (``torch.equal``), whether they are close
(``torch.allclose``, rtol 1e-5, atol 1e-6) and the largest absolute difference.
A run passes if every tensor is close; bitwise equality is reported, and
expected (deterministic algorithms are on).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import _common

STEP = "correctness"
SCRATCH_ELEMENTS = (128, 16 << 10, 256 << 10, 4 << 20, 64 << 20)  # int32: 512 B .. 256 MiB


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--allocator", choices=("native", "memscale"), help="run mode: which CUDA allocator")
    p.add_argument("--compare", nargs="+", metavar="PT", help="compare mode: reference .pt then the others")
    p.add_argument("--save", help="run mode: .pt file for losses, gradients and parameters")
    p.add_argument("--out", help="JSON result file")
    p.add_argument("--threshold", default="90%", help="memscale.install(threshold=...) (default 90%%)")
    p.add_argument("--dtr-fraction", type=float, default=None, help="run forward+backward in memscale.dtr(budget=F x native peak)")
    p.add_argument("--native-json", help="the native run's JSON (its peak sets the DTR budget)")
    p.add_argument("--dtr-budget", type=int, default=None, help="DTR budget in bytes (instead of --dtr-fraction)")
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--batch", type=int, default=8192)
    p.add_argument("--width", type=int, default=512, help="input width; hidden layers are 2x this")
    p.add_argument("--chain", type=int, default=6, help="matrices in the product chain")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: test the script without a GPU (native only)")
    p.add_argument("--rtol", type=float, default=1e-5)
    p.add_argument("--atol", type=float, default=1e-6)
    p.add_argument("--dry-run", action="store_true", help="check imports and print the plan; touch no GPU")
    a = p.parse_args(argv)
    if bool(a.allocator) == bool(a.compare):
        p.error("give exactly one of --allocator (run mode) or --compare (compare mode)")
    if a.compare and len(a.compare) < 2:
        p.error("--compare needs a reference .pt and at least one other")
    if a.allocator and not a.dry_run and not a.save:
        p.error("--save is required in run mode")
    if a.dtr_fraction is not None:
        if not 0 < a.dtr_fraction <= 1:
            p.error(f"--dtr-fraction {a.dtr_fraction}: must be in (0, 1]")
        if not a.native_json:
            p.error("--dtr-fraction needs --native-json (the native run's peak)")
        if a.dtr_budget is not None:
            p.error("give --dtr-fraction or --dtr-budget, not both")
    if a.device == "cpu" and a.allocator == "memscale":
        p.error("--device cpu runs the native allocator only (memscale's allocator is a CUDA allocator)")
    if a.iterations < 1:
        p.error("--iterations must be >= 1")
    return a


def plan(a: argparse.Namespace) -> list[str]:
    if a.compare:
        return [f"compare {pt} with {a.compare[0]} (torch.equal, allclose rtol={a.rtol} atol={a.atol})" for pt in a.compare[1:]]
    steps = []
    if a.allocator == "memscale":
        steps.append(f"memscale.install(threshold={a.threshold!r}, backend='cuda') before any CUDA use")
    steps.append(f"scratch tensors of {', '.join(_common.fmt_bytes(n * 4) for n in SCRATCH_ELEMENTS)} on {a.device}")
    steps.append(
        f"MLP {a.width}->{2 * a.width}->{2 * a.width}->{a.width} + {a.chain} chained {a.width}x{a.width} products, "
        f"batch {a.batch}, {a.iterations} iterations of forward+backward+SGD"
    )
    if a.dtr_fraction is not None:
        steps.append(f"forward+backward inside memscale.dtr(budget={a.dtr_fraction} x peak of {a.native_json})")
    elif a.dtr_budget is not None:
        steps.append(f"forward+backward inside memscale.dtr(budget={a.dtr_budget} bytes)")
    steps.append(f"save losses, gradients, parameters to {a.save}")
    return steps


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    _common.setup_env()
    step = f"{STEP}_compare" if a.compare else f"{STEP}_{a.allocator}{'_dtr' if (a.dtr_fraction or a.dtr_budget) else ''}"
    if a.dry_run:
        print(f"{step} --dry-run: plan")
        for line in plan(a):
            print("  - " + line)
        import torch  # noqa: F401 - the import check

        print(f"  torch {torch.__version__} imports")
        if a.allocator == "memscale" or a.dtr_fraction or a.dtr_budget:
            import memscale
            from memscale import dtr  # noqa: F401

            print(f"  memscale imports ({memscale.__file__}); library {_common.library_path()} "
                  f"{'exists' if _common.library_path().exists() else 'MISSING'}")
        return 0
    if a.compare:
        return compare(a)
    skipped = _common.skip_without_cuda(step, a.device, a.out)
    if skipped is not None:
        return skipped
    return run(a, step)


def run(a: argparse.Namespace, step: str) -> int:
    result = _common.record(step, status="failed", allocator=a.allocator, device=a.device)
    try:
        result.update(_run(a))
        result["status"] = "ok"
        rc = 0
    except Exception as exc:  # noqa: BLE001 - reported, exit 1
        import traceback

        traceback.print_exc()
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["diagnosis"] = getattr(exc, "diagnosis", None)
        print(f"FAIL {step}: {result['error']}", flush=True)
        rc = 1
    _common.write_json(a.out, result)
    return rc


def _run(a: argparse.Namespace) -> dict[str, Any]:
    info: dict[str, Any] = {}
    if a.allocator == "memscale":
        import memscale

        # First thing: PyTorch swaps its allocator only before CUDA is initialized.
        inst = memscale.install(threshold=a.threshold, backend="cuda")
        info["memscale_thresholds"] = inst.thresholds
        info["memscale_library"] = str(inst.library)
    import torch

    dev = torch.device(a.device)
    torch.use_deterministic_algorithms(True, warn_only=True)
    info["torch"] = torch.__version__
    if dev.type == "cuda":
        info["device_name"] = torch.cuda.get_device_name(0)
    budget = a.dtr_budget
    if a.dtr_fraction is not None:
        native = _common.read_json(a.native_json)
        peak = (native or {}).get("peak_allocated_fwd_bwd")
        if not peak:
            raise RuntimeError(f"{a.native_json} has no peak_allocated_fwd_bwd (did the native run succeed?)")
        budget = int(a.dtr_fraction * peak)
        info["native_peak_allocated_fwd_bwd"] = peak
    region = None
    if budget is not None:
        import memscale

        region = memscale.dtr(budget)
        info["dtr_budget"] = budget

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def reset_peak() -> None:
        if dev.type != "cuda":
            return
        if a.allocator == "memscale":
            import memscale

            memscale.reset_peak_memory_stats(0)
        else:
            torch.cuda.reset_peak_memory_stats(0)

    def peak_allocated() -> int | None:
        if dev.type != "cuda":
            return None
        if a.allocator == "memscale":
            import memscale

            return int(memscale.max_memory_allocated(0))
        return int(torch.cuda.max_memory_allocated(0))

    t0 = time.perf_counter()
    # Scratch phase: allocations from 512 B to 256 MiB, each reduced exactly.
    scratch = []
    for n in SCRATCH_ELEMENTS:
        t = torch.arange(n, device=dev, dtype=torch.int32).remainder_(97)
        scratch.append(int(t.sum().item()))  # int64 accumulation: exact
        expected = sum(range(97)) * (n // 97) + sum(range(n % 97))
        if scratch[-1] != expected:
            raise RuntimeError(f"scratch reduction of {n} elements: got {scratch[-1]}, expected {expected}")
        del t
    sync()

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1234)
    w = a.width
    mlp = torch.nn.Sequential(
        torch.nn.Linear(w, 2 * w),
        torch.nn.GELU(),
        torch.nn.Linear(2 * w, 2 * w),
        torch.nn.LayerNorm(2 * w),
        torch.nn.ReLU(),
        torch.nn.Linear(2 * w, w),
    )
    chain = [torch.nn.Parameter(torch.randn(w, w, generator=g) / w**0.5) for _ in range(a.chain)]
    x = torch.randn(a.batch, w, generator=g).to(dev)
    target = torch.randn(a.batch, w, generator=g).to(dev)
    mlp = mlp.to(dev)
    chain = [torch.nn.Parameter(c.detach().to(dev)) for c in chain]
    params = [(f"mlp.{n}", p) for n, p in mlp.named_parameters()] + [(f"chain.{i}", c) for i, c in enumerate(chain)]
    lr = 1e-2
    sync()
    reset_peak()

    def fwd_bwd() -> Any:
        h = mlp(x)
        y = x
        for c in chain:
            y = torch.tanh(y @ c)
        loss = torch.nn.functional.mse_loss(h, target) + (y * h).mean() + torch.softmax(y, dim=-1).pow(2).sum() / a.batch
        loss.backward()
        return loss

    losses = []
    for _ in range(a.iterations):
        for _, p in params:
            p.grad = None
        if region is None:
            loss = fwd_bwd()
        else:
            with region:
                try:
                    loss = fwd_bwd()
                except Exception as exc:
                    if dev.type == "cuda":  # what holds the memory, before the region lets go
                        exc.diagnosis = _common.memory_breakdown(torch)  # type: ignore[attr-defined]
                        print(f"memory at the failure: {exc.diagnosis}", flush=True)  # type: ignore[attr-defined]
                    raise
            loss = region.unwrap(loss)
        losses.append(loss.detach().to("cpu"))
        with torch.no_grad():
            for _, p in params:
                p -= lr * p.grad
    sync()
    info["peak_allocated_fwd_bwd"] = peak_allocated()
    info["seconds"] = round(time.perf_counter() - t0, 3)
    info["losses"] = [float(v) for v in losses]
    info["scratch_sums"] = scratch
    if region is not None:
        s = region.summary()
        info["dtr_summary"] = {k: v for k, v in s.items() if isinstance(v, (int, float, str))}
        if info["peak_allocated_fwd_bwd"] is not None and budget:
            info["peak_over_budget_bytes"] = info["peak_allocated_fwd_bwd"] - budget
    if a.allocator == "memscale":
        import memscale
        from memscale._native import lib as _lib

        st = memscale.memory_stats(0)
        info["memscale_stats"] = {
            k: int(st[k])
            for k in (
                "allocated_bytes.all.current",
                "allocated_bytes.all.peak",
                "reserved_bytes.all.peak",
                "num_alloc_retries",
                "num_ooms",
            )
            if k in st
        }
        info["memscale_error_count"] = _lib.error_count()
    saved = {
        "losses": torch.stack(losses),
        "grads": {n: p.grad.detach().to("cpu") for n, p in params},
        "params": {n: p.detach().to("cpu") for n, p in params},
        "meta": {"allocator": a.allocator, "dtr_budget": budget, "device": a.device},
    }
    os.makedirs(os.path.dirname(os.path.abspath(a.save)), exist_ok=True)
    torch.save(saved, a.save)
    info["saved"] = a.save
    print(f"losses {info['losses']}; peak allocated (fwd+bwd) {_common.fmt_bytes(info['peak_allocated_fwd_bwd'])}"
          + (f"; DTR {info['dtr_summary']}" if region is not None else ""), flush=True)
    return info


def compare(a: argparse.Namespace) -> int:
    import torch

    result = _common.record(f"{STEP}_compare", status="ok", reference=a.compare[0], rtol=a.rtol, atol=a.atol, runs=[])
    try:
        ref = torch.load(a.compare[0], map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001
        result.update(status="failed", error=f"cannot load reference {a.compare[0]}: {exc}")
        print(f"FAIL correctness compare: {result['error']}", flush=True)
        _common.write_json(a.out, result)
        return 1
    rc = 0
    for path in a.compare[1:]:
        run: dict[str, Any] = {"file": path}
        try:
            other = torch.load(path, map_location="cpu", weights_only=True)
            run.update(compare_one(ref, other, a.rtol, a.atol))
        except Exception as exc:  # noqa: BLE001 - a missing run is a failed comparison
            run.update(passed=False, error=f"{type(exc).__name__}: {exc}")
        result["runs"].append(run)
        verdict = "PASS" if run.get("passed") else "FAIL"
        detail = run.get("error") or (
            f"bitwise_equal={run['bitwise_equal']} max_abs_diff={run['max_abs_diff']:.3g} "
            f"tensors={run['tensors']} not_close={run['not_close'][:5]}"
        )
        print(f"{verdict} {path} vs {a.compare[0]}: {detail}", flush=True)
        if not run.get("passed"):
            rc = 1
    if rc:
        result["status"] = "failed"
    _common.write_json(a.out, result)
    return rc


def compare_one(ref: dict[str, Any], other: dict[str, Any], rtol: float, atol: float) -> dict[str, Any]:
    """Compare two saved runs tensor by tensor."""
    import torch

    pairs: list[tuple[str, Any, Any]] = [("losses", ref["losses"], other["losses"])]
    for group in ("grads", "params"):
        names = sorted(set(ref[group]) | set(other[group]))
        for n in names:
            pairs.append((f"{group}.{n}", ref[group].get(n), other[group].get(n)))
    bitwise = True
    max_diff = 0.0
    not_close: list[str] = []
    for name, x, y in pairs:
        if x is None or y is None or x.shape != y.shape or x.dtype != y.dtype:
            not_close.append(f"{name} (missing or shape/dtype differs)")
            bitwise = False
            continue
        if not torch.equal(x, y):
            bitwise = False
        if x.numel():
            d = (x.double() - y.double()).abs().max().item()
            if d != d:  # NaN
                d = float("inf")
            max_diff = max(max_diff, d)
        if not torch.allclose(x, y, rtol=rtol, atol=atol):
            not_close.append(name)
    return {
        "tensors": len(pairs),
        "bitwise_equal": bitwise,
        "max_abs_diff": max_diff,
        "not_close": not_close,
        "passed": not not_close,
        "meta": other.get("meta"),
    }


if __name__ == "__main__":
    sys.exit(main())
