"""The ``memscale`` console script: runs the Go command shipped in the wheel
(``memscale/bin/memscale``: ``info``, ``replay``, ``version``...).

In a checkout without an installed wheel it runs the repository's
``build/memscale`` (``make cli``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def command_path() -> Path:
    """The Go command: next to the package, else the repository's build/."""
    candidates = [_PACKAGE_DIR / "bin" / "memscale"]
    candidates += [d / "build" / "memscale" for d in _PACKAGE_DIR.parents]
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    tried = ", ".join(str(p) for p in candidates[:3])
    raise SystemExit(
        f"memscale: the memscale command was not found (tried {tried}, ...): "
        "reinstall with pip install ./pytorch_plugin, or run make cli"
    )


def main() -> None:
    """Replace this process with the Go command and its arguments."""
    path = command_path()
    os.execv(path, [str(path), *sys.argv[1:]])
