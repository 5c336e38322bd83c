"""``python -m memscale run [--threshold SIZE] SCRIPT [ARGS...]``: an unmodified
training script under DTR. ``python -m memscale check [--steps N] SCRIPT
[ARGS...]``: is the script safe under DTR? (its first N training steps under
the stress setting, every rebuild verified; exit status 1 when not).
``python -m memscale record [--device cpu] OUT.pickle SCRIPT [ARGS...]``: the script under
PyTorch's own allocator, its allocations recorded as a memory snapshot for
``memscale bench replay`` (:func:`memscale.record_snapshot`).

The script runs as ``python SCRIPT ARGS...`` would run it (``sys.argv``,
``sys.path[0]`` and ``__name__ == "__main__"`` as usual; ``-m MODULE`` runs a module),
after :func:`memscale.enable`: on a GPU the memscale allocator is installed first,
every training step (first forward with gradients .. ``optimizer.step()``) runs
in a DTR region, and the budget is ``MEMSCALE_EVICTION_THRESHOLD`` (or
``--threshold``). At exit the totals are printed to standard error: steps,
evictions, rematerializations, peak against the budget, compute overhead.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
from typing import Any

from ._budget import THRESHOLD_ENV


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m memscale", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a training script under DTR")
    run.add_argument("--threshold", help=f"eviction threshold (sets {THRESHOLD_ENV}): bytes, 12GiB, 75%% (GPU)")
    run.add_argument(
        "--unit", choices=("op", "block", "auto"), default=None,
        help="what DTR tracks: every op (a region per step, any model), every call of the models' "
        "repeated blocks (memscale.blocks: no per-op cost), or auto (blocks where a model has them); "
        "default: MEMSCALE_UNIT, else op",
    )
    run.add_argument("--quiet", action="store_true", help="do not print the totals at exit")
    run.add_argument("--summary-json", help="also write the totals as JSON to this file")
    run.add_argument("-m", dest="module", help="run a module (as python -m MODULE) instead of a script")
    run.add_argument("target", nargs=argparse.REMAINDER, help="SCRIPT [ARGS...] (or the module's ARGS with -m)")
    check = sub.add_parser("check", help="check a training script under DTR's stress setting")
    check.add_argument("--steps", type=int, default=1, help="training steps to check (default 1)")
    check.add_argument("-m", dest="module", help="run a module (as python -m MODULE) instead of a script")
    check.add_argument("target", nargs=argparse.REMAINDER, help="SCRIPT [ARGS...] (or the module's ARGS with -m)")
    rec = sub.add_parser("record", help="record a script's allocations as a PyTorch memory snapshot (for memscale bench replay)")
    rec.add_argument("output", help="the snapshot pickle to write")
    rec.add_argument("--device", choices=("cuda", "cpu"), help="cuda: PyTorch's memory history; cpu: the CPU allocator (default: cuda if available)")
    rec.add_argument("-m", dest="module", help="run a module (as python -m MODULE) instead of a script")
    rec.add_argument("target", nargs=argparse.REMAINDER, help="SCRIPT [ARGS...] (or the module's ARGS with -m)")
    return p


def _runner(module: str | None, target: list[str]) -> Any:
    """A function running the script or module as ``python`` would."""

    def run() -> None:
        if module is not None:
            sys.argv = [module, *target]
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            sys.argv = target
            sys.path.insert(0, os.path.dirname(os.path.abspath(target[0])))
            runpy.run_path(target[0], run_name="__main__")

    return run


def _check(args: argparse.Namespace, target: list[str]) -> int:
    from ._check import check_program

    try:
        report = check_program(_runner(args.module, target), steps=args.steps)
    except SystemExit as exc:  # the script exited before its first step ended
        print(f"memscale check: the program exited ({exc.code}) before a training step ended", file=sys.stderr)
        return 2
    print(report, file=sys.stderr)
    return 0 if report.safe else 1


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m memscale``; returns the exit status."""
    args = _parser().parse_args(argv)
    target = list(args.target)
    if target[:1] == ["--"]:
        target = target[1:]
    if args.module is None and not target:
        print(f"python -m memscale {args.command}: give the script to run (or -m MODULE)", file=sys.stderr)
        return 2
    if args.command == "check":
        return _check(args, target)
    if args.command == "record":
        from .record import record_program

        return record_program(args.output, args.device, _runner(args.module, target))
    if args.threshold is not None:
        os.environ[THRESHOLD_ENV] = args.threshold

    import memscale

    enabled = memscale.enable(memscale.Config(unit=args.unit))
    status = 0
    try:
        _runner(args.module, target)()
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    finally:
        enabled.disable()
        summary = enabled.summary()
        if enabled.active and not args.quiet:
            # One write of the whole line: ranks of a torchrun job share the
            # stderr pipe, and print() writes the text and its newline apart.
            sys.stderr.write(f"memscale: {summary}\n")
            sys.stderr.flush()
        if args.summary_json:
            with open(args.summary_json, "w") as f:
                json.dump({"active": enabled.active, **summary.as_dict()}, f, indent=1)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
