#!/usr/bin/env python3
"""PyTorch's OpInfo corpus through a DTR region: a Markdown report.

Runs what ``pytorch_plugin/tests/test_opdb.py`` runs (the logic is
``pytorch_plugin/tests/opdb_corpus.py``) and writes the counts, the documented
exceptions, the skips by reason and every failure with the first line of its
error:

    .venv/bin/python bench/opdb_report.py --markdown bench/results/opdb.md

``--mode``: ``auto`` (``memscale.dtr(stress=True)`` when ``memscale.dtr``
accepts it, else ``memscale.dtr(budget=None)``), ``stress``, ``unbudgeted``,
``emulated-stress`` (the harness evicts everything after every op).
``--setting DTYPE/VARIANT/INPUTS`` (repeatable): the samples' dtype; the
op's ``function`` or ``inplace`` variant (on clones made inside the run); the
op's tensor arguments as the sample's plain tensors (``leaves``) or as clones
made inside the run (``intermediates``: region tensors, evictable). Every mode
runs every setting, one after the other, into one report. ``--samples``
changes the samples per op; ``--no-foreach`` leaves out ``foreach_op_db``; ``--ops``
runs the ops named (fnmatch patterns). The defaults are the test's setting.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import fnmatch
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "pytorch_plugin"))
sys.path.insert(0, str(ROOT / "pytorch_plugin" / "tests"))

import torch  # noqa: E402

import memscale  # noqa: E402
import opdb_corpus as oc  # noqa: E402


#: Ops named per skip reason at most (the dtype and variant skips are long).
MAX_LISTED = 40


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def _memscale_source() -> str:
    """Where memscale was imported from, and the commit (dirty or not) when it is this checkout."""
    package = Path(memscale.__file__).resolve().parent
    if package == ROOT / "pytorch_plugin" / "memscale":
        dirty = _git("status", "--porcelain", "--", "pytorch_plugin/memscale")
        return f"this checkout at {_git('rev-parse', '--short', 'HEAD')}" + (
            " with uncommitted changes to pytorch_plugin/memscale" if dirty else ""
        )
    return str(package)


def _library() -> str:
    """The engine library the region loaded, with its modification time."""
    try:
        from memscale._native import lib as _lib

        path = Path(_lib.find_library())
        stamp = datetime.datetime.fromtimestamp(path.stat().st_mtime, datetime.timezone.utc)
        return f"{path} (modified {stamp:%Y-%m-%d %H:%M} UTC)"
    except Exception as exc:  # noqa: BLE001 - a report line, not a check
        return f"? ({exc})"


def _normalize(message: str) -> str:
    """A failure's first line without the numbers that vary from op to op (grouping key)."""
    message = re.sub(r"\(\d+\)", "(N)", message)
    message = re.sub(r"\b(tensor|op) \d+\b", r"\1 N", message)
    message = re.sub(r"\d+(\.\d+)?(e-?\d+)?", "N", message)
    return message[:160]


def run(setting: oc.Setting, foreach: bool, patterns: list[str]) -> dict[str, Any]:
    ops = oc.corpus(foreach=foreach)
    if patterns:
        ops = [op for op in ops if any(fnmatch.fnmatchcase(oc.op_id(op), p) for p in patterns)]
    t0 = time.perf_counter()

    def progress(outcome: oc.OpOutcome) -> None:
        if outcome.status == "fail":
            print(f"FAIL {outcome.op}: {outcome.reason[:200]}", file=sys.stderr, flush=True)

    outcomes = oc.run_corpus(ops, setting, progress=progress)
    return {"setting": setting, "outcomes": outcomes, "seconds": time.perf_counter() - t0}


def markdown(runs: list[dict[str, Any]], command: str, source: str) -> str:
    out = [
        "# PyTorch's OpInfo corpus through a DTR region",
        "",
        f"Date: {datetime.date.today().isoformat()}. {os.cpu_count()} CPU cores; torch {torch.__version__}; "
        f"memscale from {source}.",
        "",
        "    " + command,
        "",
        "Every OpInfo of `op_db` (and `foreach_op_db` unless `--no-foreach`): the first samples of",
        '`op.sample_inputs("cpu", dtype, requires_grad=op.supports_autograd)`, run plainly twice',
        "(forward, and `torch.autograd.grad` of the floating outputs against fixed seeded cotangents)",
        "and once inside a fresh region (forward and backward both inside, inputs entering as plain",
        "tensors); outputs, gradients and the inputs afterwards compared bitwise",
        "(`assert_close(rtol=0, atol=0, equal_nan=True)`). The documented exceptions (ops PyTorch",
        "itself computes another way for tensor subclasses, i.e. for every tensor while a dispatch",
        "mode is active) are compared bitwise with the plain run under a do-nothing dispatch mode.",
        "See `pytorch_plugin/tests/opdb_corpus.py`. In a stress region every sample also runs in a",
        "region that evicts nothing, and the two must agree bitwise.",
        "",
        "Documented exceptions (`opdb_corpus.EXCEPTIONS`):",
        "",
        "| op | why PyTorch computes it otherwise inside a region |",
        "|---|---|",
        *(f"| `{name}` | {why} |" for name, why in oc.EXCEPTIONS.items()),
        "",
    ]
    for r in runs:
        outcomes: list[oc.OpOutcome] = r["outcomes"]
        by_status = collections.Counter(o.status for o in outcomes)
        samples = [s for o in outcomes for s in o.samples if s.index >= 0]
        by_sample = collections.Counter(s.status for s in samples)
        skips = collections.Counter(o.reason for o in outcomes if o.status == "skip")
        sample_skips = collections.Counter(s.reason for s in samples if s.status == "skip")
        failures = [o for o in outcomes if o.status == "fail"]
        setting: oc.Setting = r["setting"]
        out += [
            f"## {setting.describe()}",
            "",
            f"Region: `{oc.region_call(setting.mode)}`. Wall time: {r['seconds']:.0f} s.",
            "",
            "| what | ops | samples |",
            "|---|---:|---:|",
            f"| tried | {len(outcomes)} | {len(samples)} |",
            f"| passed bitwise | {by_status['bitwise']} | {by_sample['bitwise']} |",
            f"| passed as documented exceptions (bitwise against PyTorch's dispatch-mode path) "
            f"| {by_status['exception']} | {by_sample['exception']} |",
            f"| skipped | {by_status['skip']} | {by_sample['skip']} |",
            f"| failed | {by_status['fail']} | {by_sample['fail']} |",
            "",
            "An op passes when no sample failed and at least one ran; it is skipped when every sample was;",
            "a sample skipped inside an op that passed counts in the samples column only.",
            "",
            "Skipped, by reason:",
            "",
            "| reason | ops | samples | ops skipped |",
            "|---|---:|---:|---|",
        ]
        for reason in oc.SKIP_REASONS:
            names = sorted(o.op for o in outcomes if o.status == "skip" and o.reason == reason)
            if skips[reason] or sample_skips[reason]:
                listed = ", ".join(names) if len(names) <= MAX_LISTED else f"({len(names)} ops, not listed)"
                out.append(f"| {reason} | {skips[reason]} | {sample_skips[reason]} | {listed} |")
        ran = [o for o in outcomes if o.op in oc.EXCEPTIONS and any(x.index >= 0 for x in o.samples)]
        out += ["", "Documented exceptions in this run:" + ("" if ran else " none ran."), ""]
        for o in ran:
            out.append(f"- `{o.op}`: {o.status}{' (' + o.reason + ')' if o.reason else ''}")
            for sample in o.samples:
                if sample.status == "exception":
                    out.append(f"  - sample {sample.index}: {sample.detail.splitlines()[0][:200]}")
        out += ["", f"Failures ({len(failures)}):", ""]
        if failures:
            out += ["| op | samples failed | first line of the error |", "|---|---:|---|"]
            for o in failures:
                first = o.reason.replace("|", "\\|").replace("\n", " ")
                out.append(f"| `{o.op}` | {len(o.failures())}/{len(o.samples)} | {first[:300]} |")
            groups: dict[str, list[str]] = collections.defaultdict(list)
            for o in failures:
                groups[_normalize(o.reason)].append(o.op)
            out += ["", "The same failures grouped by their first line (numbers elided):", ""]
            for key, names in sorted(groups.items(), key=lambda kv: -len(kv[1])):
                out.append(f"- {len(names)}: {key.replace('|', '/')}: {', '.join(names)}")
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", action="append", choices=oc.MODES, help="region mode (repeatable; default auto)")
    parser.add_argument(
        "--setting",
        action="append",
        metavar="DTYPE/VARIANT/INPUTS",
        help="e.g. complex64/inplace/intermediates (repeatable; default float32/function/leaves, the test's)",
    )
    parser.add_argument("--samples", type=int, default=oc.SAMPLES, help="samples per op")
    parser.add_argument("--no-foreach", action="store_true", help="leave out foreach_op_db")
    parser.add_argument("--ops", nargs="*", default=[], help="only these op ids (fnmatch patterns)")
    parser.add_argument("--markdown", type=Path, default=ROOT / "bench" / "results" / "opdb.md")
    args = parser.parse_args(argv)
    command = ".venv/bin/python bench/opdb_report.py " + " ".join(
        shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)
    )
    # What ran, taken before running (others may commit or rebuild meanwhile).
    source = f"{_memscale_source()}; engine {_library()}"
    runs = []
    for mode in args.mode or ["auto"]:
        for spec in args.setting or ["float32/function/leaves"]:
            try:
                dtype_name, variant, inputs = spec.split("/")
                dtype = getattr(torch, dtype_name)
            except (ValueError, AttributeError):
                parser.error(f"--setting {spec!r}: expected DTYPE/VARIANT/INPUTS, e.g. float32/function/leaves")
            if variant not in ("function", "inplace") or inputs not in ("leaves", "intermediates"):
                parser.error(f"--setting {spec!r}: VARIANT is function or inplace, INPUTS leaves or intermediates")
            setting = oc.Setting(mode, args.samples, dtype, inputs, variant).resolved()
            print(f"running {setting.describe()}", file=sys.stderr, flush=True)
            runs.append(run(setting, not args.no_foreach, args.ops))
    text = markdown(runs, command.strip(), source)
    args.markdown.parent.mkdir(parents=True, exist_ok=True)
    args.markdown.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
