"""``python -m memscale run``: unmodified training scripts under DTR.

Each script runs three times in child processes: plainly; under
``python -m memscale run`` with a threshold far above anything (the step's peak,
as the engine counts it); and with the threshold at half that peak. The last
must evict and stay within the threshold, and its losses, gradients and
parameters must be bitwise the plain run's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _helpers import require_engine

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

require_engine()

import memscale  # noqa: E402

SCRIPTS = Path(__file__).resolve().parent / "scripts"

try:
    import pytorch_lightning  # noqa: F401

    _NEEDS_LIGHTNING = pytest.mark.skipif(False, reason="")
except ImportError:  # pragma: no cover - requirements-test.txt installs it
    _NEEDS_LIGHTNING = pytest.mark.skip(reason="pytorch-lightning is not installed")
PLUGIN = Path(memscale.__file__).resolve().parent.parent


def _run(
    args: list[str], tmp: Path, threshold: str | None = None, unit: str | None = "op", **env: str
) -> dict[str, Any]:
    """Run ``args`` in a child; returns the script's output file and, under
    memscale, its summary (``unit=None``: no ``--unit``, MEMSCALE_UNIT decides)."""
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSCALE_") or k == "MEMSCALE_LIBRARY"}
    child_env["PYTHONPATH"] = os.pathsep.join([str(PLUGIN), child_env.get("PYTHONPATH", "")])
    child_env["HF_HUB_OFFLINE"] = "1"
    child_env.update(env)
    out = tmp / f"out-{len(list(tmp.iterdir()))}.pt"
    summary = tmp / f"summary-{len(list(tmp.iterdir()))}.json"
    script = [str(SCRIPTS / args[0]), str(out), *args[1:]]
    if threshold is None:
        cmd = [sys.executable, *script]
    else:
        cmd = [
            sys.executable, "-m", "memscale", "run", *(["--unit", unit] if unit else []), "--threshold", threshold,
            "--summary-json", str(summary), *script,
        ]
    proc = subprocess.run(cmd, env=child_env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}"
    result: dict[str, Any] = {"out": torch.load(out), "stderr": proc.stderr}
    if threshold is not None:
        result["summary"] = json.loads(summary.read_text())
    return result


def _assert_bitwise(ref: Any, got: Any, what: str) -> None:
    if isinstance(ref, torch.Tensor):
        assert torch.equal(ref, got), f"{what} differs"
    elif isinstance(ref, dict):
        assert ref.keys() == got.keys(), what
        for key in ref:
            _assert_bitwise(ref[key], got[key], f"{what}[{key}]")
    elif isinstance(ref, list):
        assert len(ref) == len(got), what
        for i, (a, b) in enumerate(zip(ref, got)):
            _assert_bitwise(a, b, f"{what}[{i}]")
    else:
        assert ref == got, f"{what}: {got!r} != {ref!r}"


@pytest.mark.slow  # each runs a script three times in child processes
@pytest.mark.parametrize(
    ("script", "env"),
    [
        (["gpt2_adamw_loop.py", "4"], {}),
        (["gpt2_adamw_loop.py", "4"], {"FOREACH": "1"}),
        (["hf_trainer.py", "WORKDIR"], {}),
        pytest.param(["lightning_trainer.py", "WORKDIR"], {}, marks=_NEEDS_LIGHTNING),
        (["lbfgs_loop.py", "4"], {}),
    ],
    ids=["adamw-loop", "adamw-foreach-loop", "hf-trainer", "lightning-trainer", "lbfgs-positional-closure"],
)
def test_unmodified_script_runs_under_the_threshold(script: list[str], env: dict[str, str], tmp_path: Path) -> None:
    args = [str(tmp_path / "work") if a == "WORKDIR" else a for a in script]
    plain = _run(args, tmp_path, **env)
    roomy = _run(args, tmp_path, threshold="1TiB", **env)
    peak = int(roomy["summary"]["peak_usage"])
    assert roomy["summary"]["active"] and roomy["summary"]["evictions"] == 0 and peak > 0
    if script[0] == "gpt2_adamw_loop.py":
        # One batch shape: after two tracked steps that fit, steps run as plain
        # PyTorch. The first step is tracked too: the global pre-hook that opens
        # it is not given the model's keyword arguments, so it cannot count.
        assert roomy["summary"]["untracked_steps"] == roomy["summary"]["steps"] - 3 > 0, roomy["summary"]
    threshold = peak // 2
    tight = _run(args, tmp_path, threshold=str(threshold), **env)
    s = tight["summary"]
    assert s["steps"] >= 4, s
    assert s["evictions"] > 0 and s["rematerializations"] > 0, s
    assert 0 < s["peak_usage"] <= threshold, s
    assert s["budget"] == threshold and s["budget_source"] == f"--threshold {threshold}", s
    assert "memscale:" in tight["stderr"] and "evictions" in tight["stderr"]
    _assert_bitwise(plain["out"], tight["out"], script[0])
    _assert_bitwise(plain["out"], roomy["out"], script[0])


@pytest.mark.slow
def test_unmodified_script_runs_with_blocks(tmp_path: Path) -> None:
    """``memscale run --unit block`` (or ``MEMSCALE_UNIT=block``): block-level
    DTR on the model the script trains (on the CPU the threshold is a budget
    of block activations)."""
    args = ["gpt2_adamw_loop.py", "4"]
    plain = _run(args, tmp_path)
    roomy = _run(args, tmp_path, threshold="1TiB", unit="block")
    s = roomy["summary"]
    assert s["active"] and s["evictions"] == 0 and s["peak_usage"] > 0 and s["steps"] >= 3, s
    threshold = s["peak_usage"] // 2  # one of the script's two blocks
    tight = _run(args, tmp_path, threshold=str(threshold), unit=None, MEMSCALE_UNIT="block")  # no --unit
    s = tight["summary"]
    assert s["evictions"] > 0 and s["rematerializations"] > 0 and s["budget"] == threshold, s
    assert s["budget_source"] == f"--threshold {threshold}", s
    _assert_bitwise(plain["out"], tight["out"], args[0])
    _assert_bitwise(plain["out"], roomy["out"], args[0])


def test_run_without_a_threshold_on_the_cpu_measures_the_peak(tmp_path: Path) -> None:
    """No threshold: nothing is evicted, the values are the plain run's, and
    the run prints the peak it measured with the threshold that halves it -
    the one a percentage of 50 % gives on the CPU. Four steps: at 50 % the
    first two steps of each shape are measured unbudgeted (floors.MEASURED_STEPS)."""
    plain = _run(["gpt2_adamw_loop.py", "4"], tmp_path)
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSCALE_") or k == "MEMSCALE_LIBRARY"}
    child_env["PYTHONPATH"] = str(PLUGIN)
    out, summary = tmp_path / "bare.pt", tmp_path / "bare.json"
    proc = subprocess.run(
        [
            sys.executable, "-m", "memscale", "run", "--summary-json", str(summary),
            str(SCRIPTS / "gpt2_adamw_loop.py"), str(out), "4",
        ],
        env=child_env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    s = json.loads(summary.read_text())
    assert s["active"] and s["evictions"] == 0 and s["budget"] is None and s["peak_usage"] > 0, s
    assert "no threshold was set: the training steps peaked at" in proc.stderr, proc.stderr
    assert "--threshold 50%" in proc.stderr and "MEMSCALE_EVICTION_THRESHOLD=" in proc.stderr, proc.stderr
    # ... and the least threshold that works (replays of the step's program
    # searched upward from its minimum budget, a lower bound).
    assert 0 < s["min_budget"] <= s["least_threshold"], s
    assert "the least threshold found to run every step: " in proc.stderr, proc.stderr
    assert f"--threshold {s['least_threshold']}" in proc.stderr, proc.stderr
    _assert_bitwise(plain["out"], torch.load(out), "gpt2 without a threshold")
    half = _run(["gpt2_adamw_loop.py", "4"], tmp_path, threshold="50%")
    h = half["summary"]
    assert h["budget"] == h["baseline_peak"] // 2 and "--threshold 50%: of the first step's measured peak" in h[
        "budget_source"
    ], h
    assert h["evictions"] > 0 and 0 < h["peak_usage"] <= h["budget"], h
    _assert_bitwise(plain["out"], half["out"], "gpt2 at 50 % of its measured peak")


def test_run_reports_bad_input(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(PLUGIN))
    proc = subprocess.run([sys.executable, "-m", "memscale", "run"], env=env, capture_output=True, text=True)
    assert proc.returncode == 2 and "give the script" in proc.stderr
    failing = tmp_path / "fails.py"
    failing.write_text("import sys\nsys.exit(3)\n")
    proc = subprocess.run(
        [sys.executable, "-m", "memscale", "run", "--threshold", "1GiB", str(failing)],
        env=env, capture_output=True, text=True,
    )
    assert proc.returncode == 3
