"""The ``memscale`` command line: one command for everything, however memscale
was installed (the wheel's ``memscale`` script, ``python -m memscale``, or the
repository's ``build/memscale``).

Two halves, one list:

* the Python commands, here: ``run`` (a training script under DTR), ``check``
  (is it safe under DTR?) and ``record`` (its allocations as a snapshot);
* the native commands, in the Go program shipped beside the library
  (``memscale/bin/memscale`` in a wheel, ``build/memscale`` in a checkout):
  ``replay``, ``bench``, ``info``, ``version`` and ``help``. This module hands
  them over with ``execv``, so they answer at once: ``import memscale`` loads
  neither torch nor the library.

``memscale help`` (the Go program) lists both halves; the Go program hands the
Python commands back to ``python -m memscale``, so either entry point reaches
every command.

Errors: a :class:`~memscale.errors.MemscaleError` that reaches the command line
is one line, ``memscale: error: ...``, with exit status 2; ``--traceback``
(before or after the command's name) or ``MEMSCALE_DEBUG=1`` shows the full
traceback instead. Bad arguments are one line too.

The scripts run as ``python SCRIPT ARGS...`` would run them (``sys.argv``,
``sys.path[0]`` and ``__name__ == "__main__"``; ``-m MODULE`` runs a module),
after :func:`memscale.enable`.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from .errors import MemscaleError

_PACKAGE_DIR = Path(__file__).resolve().parent

#: Show full tracebacks (``1``); the command line's ``--traceback`` sets it too.
DEBUG_ENV = "MEMSCALE_DEBUG"
#: The interpreter the Go program hands the Python commands back to.
PYTHON_ENV = "MEMSCALE_PYTHON"
TRACEBACK_FLAG = "--traceback"

#: The Python commands: name -> one-line summary (the Go program's help lists
#: the same names, with these summaries, in cmd/memscale/python.go).
PYTHON_COMMANDS: dict[str, str] = {
    "run": "run a training script under DTR: memscale run [--threshold SIZE] SCRIPT [ARGS...]",
    "check": "check a training script under DTR's stress setting (exit status 1: not safe)",
    "record": "record a script's allocations as a PyTorch memory snapshot (for memscale bench replay)",
}


class UsageError(MemscaleError):
    """Bad command-line arguments (exit status 2)."""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors that name the command and its help."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")


def _target_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", dest="module", help="run a module (as python -m MODULE) instead of a script")
    p.add_argument("target", nargs=argparse.REMAINDER, help="SCRIPT [ARGS...] (or the module's ARGS with -m)")


def _parser(command: str) -> argparse.ArgumentParser:
    p = _Parser(prog=f"memscale {command}", description=PYTHON_COMMANDS[command])
    p.add_argument(TRACEBACK_FLAG, action="store_true", help="on an error, show the full traceback")
    if command == "run":
        p.add_argument(
            "--threshold",
            help="eviction threshold (sets MEMSCALE_EVICTION_THRESHOLD): bytes (12GiB, 500MB, 1073741824) or a "
            "percentage (75%%) of the GPU's memory - on a machine without a GPU, of the step's peak, which a "
            "first unbudgeted step measures. Unset: nothing is evicted and the run prints the peak it measured",
        )
        p.add_argument(
            "--unit", choices=("op", "block", "auto"), default=None,
            help="what DTR tracks: every op (a region per step, any model), every call of the models' "
            "repeated blocks (memscale.blocks: no per-op cost), or auto (blocks where a model has them); "
            "default: MEMSCALE_UNIT, else op",
        )
        p.add_argument("--quiet", action="store_true", help="do not print the totals at exit")
        p.add_argument("--summary-json", help="also write the totals as JSON to this file")
    elif command == "check":
        p.add_argument("--steps", type=int, default=1, help="training steps to check (default 1)")
    else:
        p.add_argument("output", help="the snapshot pickle to write")
        p.add_argument(
            "--device", choices=("cuda", "cpu"),
            help="cuda: PyTorch's memory history; cpu: the CPU allocator (default: cuda if available)",
        )
    _target_arguments(p)
    return p


def _runner(module: str | None, target: list[str]) -> Callable[[], None]:
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


class _Context:
    """What the command line's error handling needs from a command's arguments."""

    debug = False


def _parse(command: str, argv: Sequence[str], ctx: _Context) -> tuple[argparse.Namespace, list[str]]:
    """The command's arguments and its target (script and its arguments),
    checked before anything heavy is imported."""
    args = _parser(command).parse_args(list(argv))
    ctx.debug = ctx.debug or args.traceback
    target = list(args.target)
    if target[:1] == ["--"]:
        target = target[1:]
    if args.module is None:
        if not target:
            raise UsageError(f"give the script to run: memscale {command} SCRIPT [ARGS...] (or -m MODULE)")
        if not os.path.isfile(target[0]):
            what = "is a directory" if os.path.isdir(target[0]) else "does not exist"
            raise UsageError(
                f"the script {target[0]!r} {what}: memscale {command} takes the path of a Python file "
                "(SCRIPT [ARGS...]) or -m MODULE"
            )
    return args, target


def _status(exc: SystemExit) -> int:
    """The exit status ``python SCRIPT`` would have had for ``exc``."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def _check_threshold_settings(flag: str | None) -> None:
    """The threshold, from the flag or the environment, checked now (one line,
    naming where it came from), before torch is imported."""
    from ._allocator import budget

    if flag is not None:
        budget.check_threshold(flag, budget.THRESHOLD_FLAG)
        budget.set_from_flag(flag)
        return
    raw = os.environ.get(budget.THRESHOLD_ENV, "").strip()
    if raw:
        budget.check_threshold(raw, budget.THRESHOLD_ENV)


#: The library's log level under the command line when none is set: every
#: call that fails is raised by Python as one line, so the library's own
#: ``WARN call failed`` lines would only repeat it.
LOG_LEVEL_ENV = "MEMSCALE_LOG_LEVEL"


def _run(argv: Sequence[str], ctx: _Context) -> int:
    args, target = _parse("run", argv, ctx)
    if not ctx.debug:
        os.environ.setdefault(LOG_LEVEL_ENV, "error")
    _check_threshold_settings(args.threshold)
    if args.unit is None:
        from .config import unit_from_env

        unit_from_env()  # a bad MEMSCALE_UNIT is an error now, not after the script started

    import memscale

    from ._native.engine import NoRoomError

    enabled = memscale.enable(memscale.Config(unit=args.unit))
    status = 0
    try:
        _runner(args.module, target)()
    except SystemExit as exc:
        status = _status(exc)
    except NoRoomError as exc:  # a step met a point that does not fit, before any step measured its floor
        raise MemscaleError(
            f"{exc}. That minimum is the step's up to where it stopped; memscale run without a threshold runs "
            "the steps whole and prints the least threshold (their minimum budget)"
        ) from exc
    finally:
        enabled.disable()
        summary = enabled.summary()
        if enabled.active and not args.quiet:
            # One write of the whole text: ranks of a torchrun job share the
            # stderr pipe, and print() writes the text and its newline apart.
            sys.stderr.write(f"memscale: {summary}\n{_peak_advice(summary, args.threshold)}")
            sys.stderr.flush()
        if args.summary_json:
            with open(args.summary_json, "w") as f:
                json.dump({"active": enabled.active, **summary.as_dict()}, f, indent=1)
    return status


def _peak_advice(summary: Any, flag: str | None) -> str:
    """With no threshold set: the peak the run measured and the thresholds that
    would halve it (an empty string otherwise)."""
    from ._allocator.budget import THRESHOLD_ENV
    from .config import format_bytes

    if flag is not None or os.environ.get(THRESHOLD_ENV, "").strip() or summary.peak_usage <= 0:
        return ""
    half = summary.peak_usage // 2
    size = f"{half / 2**20:.0f}MiB" if half >= 2**20 else str(half)
    floor = ""
    least = int(getattr(summary, "least_threshold", 0) or 0)
    if least > 0:
        below = " - half is below it, so expect an error there" if least > half else ""
        floor = (
            f"; the least threshold found to run every step: {format_bytes(least)} "
            f"(--threshold {least}: replays of each step's program ran at it){below}"
        )
    elif summary.min_budget > 0:
        below = " - half is below it, so expect an error there" if summary.min_budget > half else ""
        floor = (
            f"; no threshold below {format_bytes(summary.min_budget)} can work (the steps' minimum budget, "
            f"a lower bound: parameters, gradients and the largest op's inputs and output){below}"
        )
    return (
        f"memscale: no threshold was set: the training steps peaked at {format_bytes(summary.peak_usage)}; "
        f"to run them in half of that: memscale run --threshold {size} (or --threshold 50%: of the measured "
        f"peak on a machine without a GPU), or MEMSCALE_EVICTION_THRESHOLD={size}{floor}\n"
    )


def _check(argv: Sequence[str], ctx: _Context) -> int:
    args, target = _parse("check", argv, ctx)
    from ._region.check import check_program

    try:
        report = check_program(_runner(args.module, target), steps=args.steps)
    except SystemExit as exc:  # the script exited before its first step ended
        raise MemscaleError(f"the program exited ({exc.code}) before a training step ended: nothing was checked") from None
    print(report, file=sys.stderr)
    return 0 if report.safe else 1


def _record(argv: Sequence[str], ctx: _Context) -> int:
    args, target = _parse("record", argv, ctx)
    from ._allocator.record import record_program

    return record_program(args.output, args.device, _runner(args.module, target))


_HANDLERS: dict[str, Callable[[Sequence[str], _Context], int]] = {"run": _run, "check": _check, "record": _record}


def native_command() -> Path | None:
    """The Go program: next to the package (a wheel), else the checkout's build/."""
    candidates = [_PACKAGE_DIR / "bin" / "memscale", *(d / "build" / "memscale" for d in _PACKAGE_DIR.parents)]
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    return None


def _exec_native(argv: list[str]) -> int:
    """Replace this process with the Go program (it answers the native commands
    and ``help``), telling it which interpreter the Python commands run on."""
    path = native_command()
    if path is None:
        listed = "\n".join(f"  {name:<8} {summary}" for name, summary in PYTHON_COMMANDS.items())
        print(
            f"memscale: error: the native memscale command (replay, bench, info, version) was not found next "
            f"to {_PACKAGE_DIR} or in a checkout's build/: reinstall with pip install ./pytorch_plugin, or run "
            f"make cli. The Python commands work:\n{listed}",
            file=sys.stderr,
        )
        return 2
    os.environ[PYTHON_ENV] = sys.executable
    os.execv(path, [str(path), *argv])
    raise AssertionError("unreachable")  # pragma: no cover


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``memscale`` and ``python -m memscale``; returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    ctx = _Context()
    ctx.debug = os.environ.get(DEBUG_ENV, "").strip() not in ("", "0")
    while args and args[0] == TRACEBACK_FLAG:
        ctx.debug = True
        args.pop(0)
    if not args or args[0] not in _HANDLERS:
        return _exec_native(args)
    try:
        return _HANDLERS[args[0]](args[1:], ctx)
    except MemscaleError as exc:
        if ctx.debug:
            traceback.print_exc()
        else:
            print(f"memscale: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
