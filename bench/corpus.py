#!/usr/bin/env python3
"""The script corpus: small public-style training scripts, run unchanged.

Each script in bench/scripts/ runs plainly, then under ``python -m memscale run``
with nothing to evict (``--threshold 1TiB``) and at half of the peak that run
measured (``--threshold BYTES``, the largest step's peak over two: on the CPU
``--threshold 50%`` is of the first step's peak, which for a GAN is its smallest
step, the discriminator on real data). What it printed (stdout, line by line) and every file it
saved are compared with the plain run's bitwise: a saved file's bytes, and when
they differ, what it holds once loaded (tensors with ``torch.equal``, modules by
their state dicts).

    MEMSCALE_LIBRARY=build/libmemscale.so .venv/bin/python bench/corpus.py \\
        --markdown bench/results/script-corpus.md [--scripts word_lstm,dcgan] [--variants roomy,half]

Children run with OMP_NUM_THREADS=1 (the same kernels in every run, and a fair
time ratio on a shared machine); a run's time is its wall time, the
interpreter's start and torch's import included.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS_DIR = ROOT / "bench" / "scripts"
PLUGIN = ROOT / "pytorch_plugin"

#: script -> (what it is, its CI-sized arguments).
SCRIPTS: dict[str, tuple[str, list[str]]] = {
    "word_lstm": (
        "word LSTM LM, hand-written SGD, BPTT, clipping, torch.save(model)",
        ["--batch-size", "32", "--bptt", "24", "--sentences", "300"],
    ),
    "mnist_adadelta": ("MNIST-style CNN, dropout, Adadelta, StepLR", ["--batch-size", "64", "--train-size", "256"]),
    "vision_cnn": (
        "CIFAR-style CNN, SGD momentum, cosine LR, accuracy meter",
        ["--batch-size", "64", "--train-size", "256"],
    ),
    "char_lm": ("char-level GRU LM, Adam, clipping, sampling", ["--batch-size", "32", "--seq-len", "64", "--chars", "8192"]),
    "dcgan": ("DCGAN, BatchNorm, two Adam optimizers, fixed-noise samples", ["--batch-size", "32", "--images", "128"]),
    "lbfgs_sine": ("LSTMCell sine waves in float64, LBFGS closure", ["--waves", "48", "--length", "60"]),
    "resnet_dummy": ("ResNet (basic blocks, BatchNorm) on dummy data, SGD, top-k", ["-b", "32", "--train-size", "96"]),
    "transformer_lm": ("Transformer LM, AdamW, warmup, gradient accumulation", ["--micro-batch", "8"]),
}
#: variant -> memscale run's threshold (None: the plain run). half: bytes, 50 % of roomy's peak;
#: floor: bytes, the minimum budget the roomy run measured (its steps ran whole: no budget below
#: it can run them), to show whether a script trains at its floor.
#: named: the threshold memscale names in its error at --threshold 1% (on the CPU, 1 % of the
#: first step's measured peak: the second step is refused before it starts, naming the least
#: threshold a replay of the first step's program finished at), to show that it trains.
VARIANTS: dict[str, str] = {"roomy": "1TiB", "half": "50%", "floor": "min_budget", "named": "1%"}

#: The least threshold memscale run's error names.
_NAMED = re.compile(r"The least threshold that works: --threshold (\d+) ")


@dataclass
class Run:
    """One run of a script: what it printed and saved, how long it took."""

    stdout: str
    files: dict[str, bytes]
    seconds: float
    summary: dict[str, Any] | None = None
    error: str | None = None


@dataclass
class Row:
    """One line of the table: a script under one variant, against its plain run."""

    script: str
    variant: str
    bitwise: bool
    differences: list[str] = field(default_factory=list)
    peak: int | None = None
    budget: int | None = None
    evictions: int | None = None
    floor: int | None = None  # the run's minimum budget (a lower bound on what can work)
    steps: int | None = None
    ratio: float | None = None
    error: str | None = None
    below: int | None = None  # the roomy run's floor, when this budget is below it
    named: str | None = None  # named: where the threshold came from


def _env() -> dict[str, str]:
    # MEMSCALE_NATIVE passes through: which region ran is part of the measurement (an unset one
    # can switch to the native region partway when its background build finishes).
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSCALE_") or k in ("MEMSCALE_LIBRARY", "MEMSCALE_NATIVE")}
    env["PYTHONPATH"] = os.pathsep.join([str(PLUGIN), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    env["HF_HUB_OFFLINE"] = "1"
    if "MEMSCALE_LIBRARY" not in env and (ROOT / "build" / "libmemscale.so").exists():
        env["MEMSCALE_LIBRARY"] = str(ROOT / "build" / "libmemscale.so")
    return env


def run(script: str, threshold: str | None, timeout: float = 900) -> Run:
    """Run ``script`` plainly (``threshold=None``) or under ``memscale run --threshold``."""
    args = SCRIPTS[script][1]
    with tempfile.TemporaryDirectory(prefix=f"corpus-{script}-") as tmp:
        save = Path(tmp) / "save"
        save.mkdir()
        target = [str(SCRIPTS_DIR / f"{script}.py"), "--save-dir", str(save), *args]
        summary = Path(tmp) / "summary.json"
        if threshold is None:
            cmd = [sys.executable, *target]
        else:
            cmd = [sys.executable, "-m", "memscale", "run", "--threshold", threshold, "--summary-json", str(summary),
                   *target]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=timeout, cwd=tmp)
        except subprocess.TimeoutExpired as exc:  # a row that says so, not a crash of the whole table
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            return Run(out, {}, time.perf_counter() - t0, None, f"timed out after {timeout:.0f} s")
        seconds = time.perf_counter() - t0
        files = {p.name: p.read_bytes() for p in sorted(save.iterdir())}
        error = None
        if proc.returncode != 0:
            lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
            error = f"exit {proc.returncode}: {lines[-1] if lines else '(no output)'}"
        loaded = json.loads(summary.read_text()) if summary.exists() else None
        return Run(proc.stdout, files, seconds, loaded, error)


def _script_module(script: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"corpus_{script}", SCRIPTS_DIR / f"{script}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _load(script: str, data: bytes) -> Any:
    """A saved file's contents; classes the script pickled from ``__main__``
    (``torch.save(model)``) resolve to the script's own."""
    import io

    import torch

    if str(PLUGIN) not in sys.path:  # a model saved whole under memscale may name its hooks
        sys.path.insert(0, str(PLUGIN))
    main = sys.modules["__main__"]
    module = _script_module(script)
    added = [name for name in vars(module) if not hasattr(main, name)]
    for name in added:
        setattr(main, name, getattr(module, name))
    try:
        return torch.load(io.BytesIO(data), weights_only=False)
    finally:
        for name in added:
            delattr(main, name)


def _differences(ref: Any, got: Any, what: str) -> list[str]:
    import torch

    if isinstance(ref, torch.nn.Module):
        if type(ref).__name__ != type(got).__name__:
            return [f"{what}: a {type(got).__name__}, not a {type(ref).__name__}"]
        return _differences(ref.state_dict(), got.state_dict(), f"{what}.state_dict()")
    if isinstance(ref, torch.Tensor):
        if not isinstance(got, torch.Tensor) or type(got) is not type(ref):
            return [f"{what}: {type(got).__name__}, not {type(ref).__name__}"]
        if ref.dtype != got.dtype or ref.shape != got.shape or not torch.equal(ref, got):
            return [f"{what} differs"]
        return []
    if isinstance(ref, dict):
        if not isinstance(got, dict) or list(ref) != list(got):
            return [f"{what}: other keys"]
        return [d for key in ref for d in _differences(ref[key], got[key], f"{what}[{key!r}]")]
    if isinstance(ref, (list, tuple)):
        if type(got) is not type(ref) or len(got) != len(ref):
            return [f"{what}: other length"]
        return [d for i, (a, b) in enumerate(zip(ref, got)) for d in _differences(a, b, f"{what}[{i}]")]
    return [] if ref == got else [f"{what}: {got!r} != {ref!r}"]


def compare(script: str, plain: Run, other: Run) -> list[str]:
    """What ``other`` printed or saved differently from ``plain`` (empty: bitwise)."""
    out: list[str] = []
    ref_lines, got_lines = plain.stdout.splitlines(), other.stdout.splitlines()
    if ref_lines != got_lines:
        for i, (a, b) in enumerate(zip(ref_lines, got_lines)):
            if a != b:
                out.append(f"stdout line {i + 1}: {b!r} != {a!r}")
                break
        if len(ref_lines) != len(got_lines):
            out.append(f"stdout: {len(got_lines)} lines, not {len(ref_lines)}")
    if sorted(plain.files) != sorted(other.files):
        out.append(f"saved files {sorted(other.files)}, not {sorted(plain.files)}")
    for name, data in plain.files.items():
        if name not in other.files or other.files[name] == data:
            continue
        found = _differences(_load(script, data), _load(script, other.files[name]), name)
        if not found and b"memscale" in other.files[name] and b"memscale" not in data:
            found = [f"{name}: the same state, but its pickle names memscale (hooks left on the model)"]
        out += found or [f"{name}: the same contents in other bytes (the pickle differs)"]
    return out


def check(script: str, variants: list[str]) -> list[Row]:
    """The script plainly, then under each variant; a row per variant."""
    plain = run(script, None)
    if plain.error is not None:
        return [Row(script, "plain", False, error=plain.error)]
    rows = []
    roomy: Run | None = None
    for variant in sorted(variants, key=list(VARIANTS).index):  # roomy first: half is of its peak
        threshold = VARIANTS[variant]
        floor = 0
        named = None
        if variant == "named":
            asked = run(script, threshold)
            m = _NAMED.search(asked.error or "")
            if m is None:
                error = f"--threshold {threshold} named no threshold: {asked.error}"
                rows.append(Row(script, variant, False, error=error))
                continue
            threshold = m.group(1)
            least_floor = int((asked.summary or {}).get("min_budget") or 0)
            named = (f"named by the error at --threshold {VARIANTS['named']}: {int(threshold) / 2**20:.2f} "
                     f"MiB, {int(threshold) / least_floor:.3f}x its floor" if least_floor else "named by the error")
        elif variant != "roomy":
            if roomy is None:
                roomy = run(script, VARIANTS["roomy"])
            peak = int((roomy.summary or {}).get("peak_usage") or 0)
            floor = int((roomy.summary or {}).get("min_budget") or 0)
            if not peak or not floor:
                rows.append(Row(script, variant, False, error=f"no peak measured with nothing to evict: {roomy.error}"))
                continue
            threshold = str(peak // 2 if variant == "half" else floor)
        got = run(script, threshold)
        if variant == "roomy":
            roomy = got
        s = got.summary or {}
        row = Row(
            script,
            variant,
            False,
            peak=s.get("peak_usage"),
            budget=s.get("budget"),
            evictions=s.get("evictions"),
            floor=s.get("min_budget"),
            steps=s.get("steps"),
            ratio=got.seconds / plain.seconds,
            error=got.error,
            below=floor if floor and int(threshold) < floor else None,
            named=named,
        )
        if got.error is None:
            row.differences = compare(script, plain, got)
            row.bitwise = not row.differences
        rows.append(row)
    return rows


def _mib(n: int | None) -> str:
    return "-" if not n else f"{n / 2**20:.2f} MiB"


def markdown(rows: list[Row], seconds: float) -> str:
    lines = [
        "# The script corpus under `memscale run`",
        "",
        f"{datetime.date.today().isoformat()}, CPU (the 2-core development machine, shared), "
        f"`bench/corpus.py` in {seconds:.0f} s. Each script of bench/scripts/ ran plainly, then under "
        "`python -m memscale run --threshold 1TiB` (roomy: nothing to evict) and `--threshold BYTES` "
        "(half: half of the peak the roomy run measured, its largest step's; floor: the roomy run's floor; "
        "named: the threshold memscale's error names at `--threshold 1%`). "
        "*floor*: the run's minimum budget, a lower bound on any budget that can work (`Summary.min_budget`); "
        "the roomy run's steps ran whole, so no budget below its floor can run the script. *bitwise*: every stdout line and every "
        "saved file equal to the plain run's (a file's bytes; where the bytes differ, its loaded contents - "
        "the difference is then named). *time*: wall time over the plain run's, the interpreter's start and "
        "torch's import (several seconds here) included. A step ends with its backward pass (issue 30).",
        "",
        "| script | what | variant | bitwise? | steps | peak / budget | floor | evictions | time | notes |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        what = SCRIPTS.get(r.script, ("", []))[0]
        if r.error is not None:
            verdict, notes = "failed", r.error.replace("|", "\\|")
            if r.below:
                notes = f"below the roomy run's floor ({_mib(r.below)}); " + notes
        else:
            verdict = "yes" if r.bitwise else "no"
            notes = "; ".join(r.differences).replace("|", "\\|")
        if r.named:
            notes = f"{r.named}; {notes}" if notes else r.named
        budget = "1 TiB" if r.variant == "roomy" else _mib(r.budget)
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f}x"
        lines.append(
            f"| {r.script} | {what} | {r.variant} | {verdict} | {r.steps if r.steps is not None else '-'} | "
            f"{_mib(r.peak)} / {budget} | {_mib(r.floor)} | {r.evictions if r.evictions is not None else '-'} | "
            f"{ratio} | {notes} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scripts", default=",".join(SCRIPTS), help="comma-separated names (default: all)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="roomy, half, floor, named (default: all)")
    parser.add_argument("--markdown", help="write the table here")
    args = parser.parse_args()
    scripts = [s for s in args.scripts.split(",") if s]
    variants = [v for v in args.variants.split(",") if v]
    unknown = [s for s in scripts if s not in SCRIPTS] + [v for v in variants if v not in VARIANTS]
    if unknown:
        print(f"corpus.py: error: unknown script or variant {unknown}: scripts {list(SCRIPTS)}, variants "
              f"{list(VARIANTS)}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    rows: list[Row] = []
    for script in scripts:
        found = check(script, variants)
        for r in found:
            state = r.error or ("bitwise" if r.bitwise else "; ".join(r.differences))
            print(f"{script} {r.variant}: {state} (steps {r.steps}, peak {_mib(r.peak)}, budget {_mib(r.budget)}, "
                  f"evictions {r.evictions}, time {r.ratio and round(r.ratio, 2)}x)", flush=True)
        rows += found
    text = markdown(rows, time.perf_counter() - t0)
    if args.markdown:
        Path(args.markdown).write_text(text)
    else:
        print(text)
    return 0 if all(r.bitwise for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
