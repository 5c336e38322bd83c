"""Build hook of the memscale wheel: compiles libmemscale.so and the memscale
command with the Go toolchain and ships both inside the package.

``pip install ./pytorch_plugin`` (or ``pip wheel``, ``python -m build``) runs
``go build`` on the Go module this directory sits in (its parent holds
``go.mod``), puts ``memscale/libmemscale.so`` and ``memscale/bin/memscale`` into
the wheel and tags the wheel for this platform (``py3-none-<platform>``: the
library does not depend on the Python version). The version is the library's
(``MEMSCALE_VERSION`` in ``cabi/memscale.h``); the build stops when
``memscale/_version.py`` says otherwise. ``$GO`` names the go command (default
``go`` on ``PATH``). The repository's Makefile builds the same two targets with
the same commands (``make lib cli``), and ``make test`` builds and installs this
wheel (``make test-wheel``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
MODULE_ROOT = HERE.parent
GO_MIN = (1, 26)


def _header_version() -> str:
    header = MODULE_ROOT / "cabi" / "memscale.h"
    match = re.search(r'#define MEMSCALE_VERSION "([^"]+)"', header.read_text()) if header.is_file() else None
    if match is None:
        raise SystemExit(f"memscale build: no MEMSCALE_VERSION in {header}: build from a memscale checkout")
    return match.group(1)


def _package_version() -> str:
    match = re.search(r'__version__ = "([^"]+)"', (HERE / "memscale" / "_version.py").read_text())
    if match is None:
        raise SystemExit("memscale build: no __version__ in memscale/_version.py")
    return match.group(1)


def version() -> str:
    """The one version number; the build stops when the package disagrees."""
    library, package = _header_version(), _package_version()
    if library != package:
        raise SystemExit(
            f"memscale build: cabi/memscale.h says {library} but memscale/_version.py says {package}; "
            "they are one version number: make them equal"
        )
    return library


def go_command() -> str:
    """The go command, checked to be a recent enough toolchain."""
    go = os.environ.get("GO", "go")
    path = shutil.which(go)
    if path is None:
        raise SystemExit(
            f"memscale build: the Go toolchain ({go!r}) was not found. Building memscale compiles "
            f"libmemscale.so and the memscale command from Go sources: install Go >= "
            f"{GO_MIN[0]}.{GO_MIN[1]} (https://go.dev/dl/) and put it on PATH, or set GO=/path/to/go"
        )
    out = subprocess.run([path, "env", "GOVERSION"], capture_output=True, text=True, check=False).stdout.strip()
    match = re.match(r"go(\d+)\.(\d+)", out)
    if match is None or (int(match.group(1)), int(match.group(2))) < GO_MIN:
        raise SystemExit(
            f"memscale build: {path} is {out or 'not a Go toolchain'}; memscale needs Go >= {GO_MIN[0]}.{GO_MIN[1]} "
            "(https://go.dev/dl/; or set GO=/path/to/go)"
        )
    return path


class BuildWithGo(build_py):
    """build_py, then ``go build`` of the library and the command into the package."""

    def run(self) -> None:
        super().run()
        if not (MODULE_ROOT / "go.mod").is_file():
            raise SystemExit(
                f"memscale build: {MODULE_ROOT / 'go.mod'} not found: the wheel is built from the memscale "
                "repository (pip install ./pytorch_plugin in a checkout), which holds the Go sources"
            )
        go = go_command()
        package = Path(self.build_lib).resolve() / "memscale"
        (package / "bin").mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "CGO_ENABLED": "1"}
        # The Makefile's lib and cli rules, with the same arguments.
        for args in (
            ["build", "-buildmode=c-shared", "-o", str(package / "libmemscale.so"), "./cabi"],
            ["build", "-o", str(package / "bin" / "memscale"), "./cmd/memscale"],
        ):
            self.announce(f"memscale: {go} {' '.join(args)}", level=2)
            done = subprocess.run([go, *args], cwd=MODULE_ROOT, env=env, check=False)
            if done.returncode != 0:
                raise SystemExit(f"memscale build: `go {' '.join(args)}` failed (exit status {done.returncode})")
        (package / "libmemscale.h").unlink(missing_ok=True)  # cgo's header names internal symbols only


class NativeDistribution(Distribution):
    """The package holds native code: built into the platform's library directory."""

    def has_ext_modules(self) -> bool:
        return True


class PlatformWheel(bdist_wheel):
    """A wheel for this platform (it holds native code), for any Python 3."""

    def finalize_options(self) -> None:
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self) -> tuple[str, str, str]:
        _, _, platform = super().get_tag()
        return "py3", "none", platform


setup(
    version=version(),
    distclass=NativeDistribution,
    cmdclass={"build_py": BuildWithGo, "bdist_wheel": PlatformWheel},
)
