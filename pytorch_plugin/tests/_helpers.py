"""Helpers shared by the plugin tests (imported by module name: pytest puts this
directory on sys.path)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import memscale
from memscale import _lib


def run_child(code: str, timeout: float = 120, **env: str | None) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter that loads the same library (``None`` unsets a variable)."""
    child_env = {**os.environ, _lib.LIBRARY_ENV: str(_lib.find_library())}
    for name, value in env.items():
        if value is None:
            child_env.pop(name, None)
        else:
            child_env[name] = value
    child_env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(memscale.__file__).resolve().parent.parent), child_env.get("PYTHONPATH", "")]
    )
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=child_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
