"""Checks the wheel `make wheel` built, installed with `pip install --target SITE`
(run by `make test-wheel` with PYTHONPATH=SITE and no MEMSCALE_LIBRARY):

    python wheel_check.py WHEEL_DIR

The wheel is tagged for this platform and ships libmemscale.so and the memscale
command; the installed package loads its own library (whose version is the
package's), its console script runs the command, and a DTR region evicts.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path


def main() -> None:
    wheel_dir = Path(sys.argv[1])
    site = wheel_dir / "site"
    (wheel,) = wheel_dir.glob("memscale-*.whl")
    assert not wheel.name.endswith("-none-any.whl"), f"{wheel.name}: a pure-Python tag for a wheel with native code"
    assert wheel.name.startswith("memscale-") and "-py3-none-" in wheel.name, wheel.name
    names = set(zipfile.ZipFile(wheel).namelist())
    for shipped in (
        "memscale/libmemscale.so",
        "memscale/bin/memscale",
        "memscale/_region/dispatch.py",
        "memscale/_native/csrc/session.cpp",
        "memscale/_native/csrc/session.h",
    ):
        assert shipped in names, f"{wheel.name} lacks {shipped}"

    assert "MEMSCALE_LIBRARY" not in os.environ
    import memscale
    from memscale._native import lib as _lib

    assert Path(memscale.__file__).resolve().is_relative_to(site.resolve()), memscale.__file__
    library = _lib.library_path()
    assert library == (site / "memscale" / "libmemscale.so").resolve(), library
    assert _lib.version() == f"memscale {memscale.__version__}", (_lib.version(), memscale.__version__)

    command = site / "bin" / "memscale"
    out = subprocess.run([str(command), "version"], capture_output=True, text=True, check=True).stdout
    assert out.strip() == f"memscale {memscale.__version__}", out
    # One command line: the console script lists the Python and the native commands and
    # runs either half.
    helped = subprocess.run([str(command), "--help"], capture_output=True, text=True, check=True).stdout
    assert all(f"  {name} " in helped for name in ("run", "check", "record", "replay", "bench", "info")), helped
    run_help = subprocess.run([str(command), "run", "--help"], capture_output=True, text=True, check=True).stdout
    assert "usage: memscale run" in run_help, run_help

    import torch

    x = torch.randn(256, 256, requires_grad=True)
    with memscale.dtr(budget=2 << 20) as region:
        y = x
        for _ in range(16):
            y = torch.tanh(y * 1.01)
        y.sum().backward()
    stats = region.summary()
    assert stats["evictions"] > 0, stats
    print(f"wheel ok: {wheel.name}, {library}, {out.strip()}, {stats['evictions']} evictions")


if __name__ == "__main__":
    main()
