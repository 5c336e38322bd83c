"""The ``memscale`` command line: one command for everything, answered at once,
and errors a user can act on - one line, naming what was given, where it came
from and what would work (``memscale/_cli.py``, ``cmd/memscale/python.go``).

Each case runs the command in a child process, as a user types it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PLUGIN = Path(__file__).resolve().parent.parent
REPO = PLUGIN.parent
SCRIPT = REPO / "samples" / "quickstart.py"


def _memscale(*args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    child = {k: v for k, v in os.environ.items() if not k.startswith("MEMSCALE_") or k == "MEMSCALE_LIBRARY"}
    child["PYTHONPATH"] = str(PLUGIN)
    child.update(env)
    return subprocess.run(
        [sys.executable, "-m", "memscale", *args], env=child, capture_output=True, text=True, timeout=timeout
    )


def test_importing_the_command_line_loads_neither_torch_nor_the_library() -> None:
    code = (
        "import sys, memscale, memscale._cli\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "assert not any(m.startswith('memscale._native') for m in sys.modules), 'library binding imported'\n"
        "print(memscale.__version__)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=str(PLUGIN)),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


needs_native = pytest.mark.skipif(
    not (REPO / "build" / "memscale").is_file(), reason="build/memscale not built (make cli)"
)


@needs_native
def test_version_and_help_list_every_command() -> None:
    version = _memscale("version")
    assert version.returncode == 0 and version.stdout.startswith("memscale "), version
    import memscale

    assert version.stdout.split() == ["memscale", memscale.__version__]
    helped = _memscale("--help")
    assert helped.returncode == 0, helped.stderr
    for name in ("run", "check", "record", "replay", "bench", "info", "version"):
        assert f"  {name} " in helped.stdout, helped.stdout


@needs_native
def test_the_native_program_hands_python_commands_back() -> None:
    """``build/memscale run -h`` is ``python -m memscale run -h``."""
    done = subprocess.run(
        [str(REPO / "build" / "memscale"), "run", "--help"],
        env=dict(os.environ, MEMSCALE_PYTHON=sys.executable), capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "usage: memscale run" in done.stdout and "--threshold" in done.stdout


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (["run", "--threshold", "-5", str(SCRIPT)], {}, "--threshold='-5': must be positive"),
        (["run", "--threshold", "200%", str(SCRIPT)], {}, "200% is over 100 %"),
        (["run", "--threshold", "0", str(SCRIPT)], {}, "--threshold=0: a threshold must be positive"),
        (["run", "--threshold", "lots", str(SCRIPT)], {}, "--threshold='lots': expected a number of bytes"),
        (["run", str(SCRIPT)], {"MEMSCALE_EVICTION_THRESHOLD": "-5"}, "MEMSCALE_EVICTION_THRESHOLD='-5': must be positive"),
        (["run", str(SCRIPT)], {"MEMSCALE_EVICTION_THRESHOLD": "150%"}, "MEMSCALE_EVICTION_THRESHOLD='150%': 150% is over"),
        (["run", str(SCRIPT)], {"MEMSCALE_UNIT": "layers"}, "MEMSCALE_UNIT='layers': expected op"),
        (["run", "--unit", "layers", str(SCRIPT)], {}, "argument --unit: invalid choice: 'layers'"),
        (["run", "missing.py"], {}, "the script 'missing.py' does not exist"),
        (["run", str(REPO)], {}, "is a directory"),
        (["run"], {}, "give the script to run"),
        (["check", "--steps", "x", str(SCRIPT)], {}, "argument --steps: invalid int value"),
    ],
    ids=["negative", "over-100", "zero", "malformed", "env-negative", "env-over-100", "env-unit", "flag-unit",
         "missing-script", "directory", "no-script", "check-steps"],
)
def test_errors_are_one_line_naming_what_was_given(args: list[str], env: dict[str, str], expected: str) -> None:
    done = _memscale(*args, **env)
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("memscale: error: "), done.stderr
    assert expected in lines[0], lines[0]
    assert done.stdout == ""


@pytest.mark.parametrize("how", ["flag", "flag-after-command", "env"])
def test_traceback_on_demand(how: str) -> None:
    args, env = ["run", "--threshold", "-5", str(SCRIPT)], {}
    if how == "flag":
        args = ["--traceback", *args]
    elif how == "flag-after-command":
        args = ["run", "--traceback", *args[1:]]
    else:
        env = {"MEMSCALE_DEBUG": "1"}
    done = _memscale(*args, **env)
    assert done.returncode == 2
    assert "Traceback (most recent call last)" in done.stderr and "ConfigError" in done.stderr, done.stderr


def test_a_budget_below_the_floor_fails_with_one_error_line_and_no_library_warnings() -> None:
    """The library's own ``WARN call failed`` lines would repeat the error that
    Python raises: under the command line its log level is ``error``."""
    done = _memscale("run", "--threshold", "30%", str(SCRIPT), timeout=300)  # far below the floor
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("memscale: error: ")]
    assert len(errors) == 1 and "is below what this" in errors[0], done.stderr
    assert "WARN" not in done.stderr, done.stderr
