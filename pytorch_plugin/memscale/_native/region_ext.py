"""The native region's torch extension: built at first use, cached, or refused.

The region's per-op path is C++ (``csrc/``, a torch extension: see
``csrc/session.h`` for the design). :func:`extension` builds it with
``torch.utils.cpp_extension.load`` the first time a process asks for it and
keeps the build in the memscale cache directory (``$MEMSCALE_CACHE_DIR``,
else ``$XDG_CACHE_HOME/memscale``, else ``~/.cache/memscale``) under a name
made of torch's version, its C++ ABI, the Python version and a hash of the
sources: a new torch or a changed source builds anew (minutes on two cores:
``make native`` does it ahead of time), everything else loads the cached
module (a fraction of a second). Each build runs in a directory of its own
and is renamed into place.

``MEMSCALE_NATIVE`` chooses: ``1`` requires the native region (a failed build
or load is an error; a missing build is made first, waiting for it), ``0``
uses the Python region. Unset (:data:`NATIVE_BY_DEFAULT`), it is the native
region when its build loads, and the Python region otherwise, with one
warning that says why and what it costs. A missing build is then made in the
background (:func:`start_background_build`: a detached ``python -m
memscale._native.region_ext`` writing a log beside the cache), so a first run
is not held for the minutes a build takes: it runs on the Python region, and
the first region entry after the build is in place (in this process or a later
one) runs native.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Final

from ..errors import ConfigError, MemscaleError
from .crossing import cache_dir

log = logging.getLogger("memscale")

#: The variable that forces the native region on (1) or off (0).
NATIVE_ENV: Final[str] = "MEMSCALE_NATIVE"
#: What an unset ``MEMSCALE_NATIVE`` means: the native region when its build
#: loads (built in the background the first time), else the Python region.
NATIVE_BY_DEFAULT: Final[bool] = True
SOURCES_DIR: Final[Path] = Path(__file__).with_name("csrc")

_lock = threading.Lock()
_module: ModuleType | None = None
_reason: str | None = None
_tried = False
_background: Path | None = None  # the log of the background build this process started
_waiting: Path | None = None  # the build this process waits for (unset MEMSCALE_NATIVE)


def choice() -> bool | None:
    """``MEMSCALE_NATIVE``: True (1), False (0) or None (unset: automatic).

    Raises:
        ConfigError: it is set to anything else.
    """
    raw = os.environ.get(NATIVE_ENV, "").strip()
    if raw == "":
        return None if NATIVE_BY_DEFAULT else False
    if raw in ("0", "1"):
        return raw == "1"
    raise ConfigError(f"{NATIVE_ENV}={raw!r}: expected 1 (the native region) or 0 (the Python region), or unset")


def build_name() -> str:
    """The extension's module name for this torch, C++ ABI and Python."""
    import torch

    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    version = torch.__version__.replace("+", "_").replace(".", "_")
    tag = sys.implementation.cache_tag.replace("-", "_")
    return f"memscale_region_t{version}_abi{abi}_{tag}"


def _source_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.suffix in (".cpp", ".h"))


def source_digest(directory: Path | None = None) -> str:
    """A hash of the extension's sources (a changed source builds anew), or
    of a copy of them in ``directory``."""
    digest = hashlib.sha256()
    for path in _source_files(directory or SOURCES_DIR):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _snapshot_sources(work: Path) -> Path:
    """A copy of the sources in ``work`` for the compiler to read: what is
    compiled is what the build is named by, even when a source changes during
    the minutes a build takes (compiled from the live directory, an edit
    mid-build once cached the old code under the new sources' name)."""
    snapshot = work / "src"
    snapshot.mkdir()
    for path in _source_files(SOURCES_DIR):
        shutil.copyfile(path, snapshot / path.name)
    return snapshot


def cached_path() -> Path:
    """Where the build for this torch, ABI, Python and source is kept."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    return cache_dir() / "torch-extensions" / f"{build_name()}-{source_digest()}{suffix}"


def _build(target: Path) -> Path:
    """Build the extension into ``target``: in a fresh directory of its own
    (no lock shared with another process, none left behind by one that was
    killed), then renamed into place, so concurrent first uses are safe."""
    from torch.utils import cpp_extension

    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="build-", dir=target.parent))
    try:
        snapshot = _snapshot_sources(work)
        digest = source_digest(snapshot)
        if not target.name.startswith(f"{build_name()}-{digest}"):
            # The sources changed since the target was named: the build is
            # filed under what it compiles (the caller's next lookup builds
            # the newer sources, if they stay).
            target = target.with_name(f"{build_name()}-{digest}{importlib.machinery.EXTENSION_SUFFIXES[0]}")
        cpp_extension.load(
            name=build_name(),
            sources=[str(p) for p in sorted(snapshot.glob("*.cpp"))],
            build_directory=str(work),
            extra_cflags=["-O2"],
            verbose=os.environ.get("MEMSCALE_DEBUG") == "1",
            is_python_module=True,
        )
        built = work / f"{build_name()}{importlib.machinery.EXTENSION_SUFFIXES[0]}"
        if not built.exists():
            built = next(work.glob(f"{build_name()}*.so"))
        os.replace(built, target)
        target.with_suffix(".failed").unlink(missing_ok=True)  # an earlier failure of these sources
    finally:
        shutil.rmtree(work, ignore_errors=True)
    prune_builds(target)
    return target


#: Builds kept per torch, ABI and Python: the newest (this source) and a few
#: before it (another checkout or version of memscale in use beside it).
KEEP_BUILDS: Final[int] = 4


def prune_builds(target: Path, keep: int = KEEP_BUILDS) -> list[Path]:
    """Remove this torch's, ABI's and Python's builds of other sources but the
    ``keep`` newest (``target`` always stays): every source change builds anew,
    so without this the cache grows by one build per change. Builds for another
    torch are left alone. A process that loaded a removed build keeps running
    (the file's data stays until it is unmapped). Work directories of builds
    untouched for ``STALE_BUILD_DIR_S`` go too. Returns what was removed."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    others = [p for p in target.parent.glob(f"{build_name()}-*{suffix}") if p != target]
    others.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    removed = []
    for old in others[max(keep - 1, 0) :]:
        try:
            old.unlink()
            removed.append(old)
        except OSError:
            pass  # another process removed it first, or it cannot be: harmless
    # Work directories a build left behind (a killed process, a failure whose
    # clean-up failed); one still in use by a concurrent build is recent.
    now = time.time()
    for work in target.parent.glob("build-*"):
        try:
            stale = work.is_dir() and now - work.stat().st_mtime > STALE_BUILD_DIR_S
        except OSError:
            continue
        if stale:
            shutil.rmtree(work, ignore_errors=True)
            if not work.exists():
                removed.append(work)
    return removed


#: A build directory untouched this long (seconds) is left over, not in use.
STALE_BUILD_DIR_S: Final[float] = 6 * 3600.0


def _load() -> ModuleType:
    from . import lib as _lib

    _lib.lib()  # the engine's library must be loaded before the extension binds to it
    target = cached_path()
    if not target.exists() and _building_elsewhere(_marker()):
        log.info("memscale: waiting for the background build of the native region's extension (%s)", target)
        _wait_for(target)
    if not target.exists():
        log.info("memscale: building the native region's extension into %s (once per torch and source)", target)
        target = _build_marked(target)
    name = build_name()
    module = sys.modules.get(name)
    if module is None:
        loader = importlib.machinery.ExtensionFileLoader(name, str(target))
        spec = importlib.util.spec_from_file_location(name, target, loader=loader)
        assert spec is not None
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        sys.modules[name] = module
    reason = module.install()
    if reason:
        raise MemscaleError(reason)
    return module


def extension() -> ModuleType | None:
    """The native region's module, loaded (or built) at the first call;
    ``None`` when it cannot be used (:func:`unavailable_reason` says why).

    With ``MEMSCALE_NATIVE=1`` a missing build is made here, waiting for it
    (minutes). Unset, a missing build is started in the background instead
    and ``None`` returned until it is in place: each call then looks for it
    again (a file lookup), so a later entry of this process can use it."""
    global _module, _reason, _tried
    if _tried:
        return _module
    with _lock:
        if _tried:
            return _module
        if choice() is None:
            global _waiting
            target = _waiting or cached_path()  # the sources hashed once while waiting
            if not target.exists():
                _waiting = target
                failed = _failed_build(target)
                _reason = failed if failed is not None else start_background_build()
                return None
        try:
            _module = _load()
        except Exception as exc:  # noqa: BLE001 - any build or load failure means: use the Python region
            first = str(exc).strip().splitlines()
            _reason = f"{type(exc).__name__}: {first[0] if first else exc}"
            _module = None
        _tried = True
        return _module


def loaded() -> ModuleType | None:
    """The module if this process loaded it already (never builds or loads)."""
    return _module


#: A background build's marker older than this (seconds) is left over from a
#: build that died (the marker names its process, which is checked first).
STALE_BUILD_MARKER_S: Final[float] = 3600.0


def _marker() -> Path:
    return cached_path().with_suffix(".building")


def _failed_build(target: Path) -> str | None:
    """Why the last background build of ``target`` failed (``None``: it did
    not): a first use does not start it again on every run (no compiler, no
    headers); ``MEMSCALE_NATIVE=1`` or ``python -m memscale._native.region_ext``
    tries again."""
    try:
        why = target.with_suffix(".failed").read_text().strip()
    except OSError:
        return None
    return (
        f"its build failed ({why}; log: {target.with_suffix('.log')}); MEMSCALE_NATIVE=1 or "
        "`python -m memscale._native.region_ext` tries again"
    )


def _building_elsewhere(marker: Path) -> bool:
    """Whether a live process other than this one is building this source
    (its marker names it)."""
    try:
        pid = int(marker.read_text().split()[0])
        age = time.time() - marker.stat().st_mtime
    except (OSError, ValueError, IndexError):
        return False
    if age > STALE_BUILD_MARKER_S or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, another user's
    return True


def _wait_for(target: Path, poll_s: float = 1.0) -> None:
    """Wait while a live background build of ``target`` runs (rather than
    compiling the same sources beside it); returns when it is in place or the
    builder is gone (the caller then builds, or loads what it left)."""
    marker = _marker()
    while not target.exists() and _building_elsewhere(marker):
        time.sleep(poll_s)


def _claim(marker: Path) -> int:
    """Create ``marker`` for a build about to start (one left over is removed
    first: the caller checked that no live process holds it) and return its
    descriptor, for the builder's pid. Raises FileExistsError when another
    process claimed it just now, OSError when the cache cannot be written."""
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.unlink(missing_ok=True)
    return os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)


def _build_marked(target: Path) -> Path:
    """:func:`_build` in this process, its marker naming this process while it
    runs, so that a first use elsewhere meanwhile waits for it or uses the
    Python region instead of starting a second build of the same sources."""
    marker = _marker()
    own = False
    try:
        fd = _claim(marker)
        os.write(fd, f"{os.getpid()}\n".encode())
        os.close(fd)
        own = True
    except OSError:
        pass  # another process marked it just now, or the cache is read-only: build all the same
    try:
        return _build(target)
    finally:
        if own:
            marker.unlink(missing_ok=True)


def _spawn_build(log_path: Path) -> int:
    """Start ``python -m memscale._native.region_ext`` detached (its own
    session: it outlives this process and ignores its signals), output to
    ``log_path``; returns its pid."""
    package_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(  # noqa: S603 - our own interpreter and module
            [sys.executable, "-m", "memscale._native.region_ext"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    return proc.pid


def start_background_build() -> str:
    """Start building this source's extension in the background, unless this
    process or a live one already is; returns why the native region cannot be
    used meanwhile (for the warning)."""
    global _background
    target = cached_path()
    marker = _marker()
    log_path = target.with_suffix(".log")
    why = (
        f"its build for torch {_torch_version()} and this memscale is being made in the background "
        f"(a few minutes, once; log: {log_path}); the next region entry after it is in place runs native"
    )
    if _background is not None or _building_elsewhere(marker):
        return why
    try:
        fd = _claim(marker)
    except FileExistsError:
        return why  # another process started one just now
    except OSError as exc:
        return _cannot_start(exc)
    try:
        pid = _spawn_build(log_path)
        os.write(fd, f"{pid}\n".encode())
    except OSError as exc:
        marker.unlink(missing_ok=True)
        return _cannot_start(exc)
    finally:
        os.close(fd)
    _background = log_path
    return why


def _cannot_start(exc: OSError) -> str:
    return f"its build cannot be started ({exc}); run `make native` or `python -m memscale._native.region_ext`"


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


def unavailable_reason() -> str | None:
    """Why the native region cannot be used (``None``: it can, or was not tried)."""
    return _reason


def library_path() -> str:
    """The engine library the extension binds to."""
    from . import lib as _lib

    return str(_lib.library_path())


def _main() -> int:
    """``python -m memscale._native.region_ext``: build this source's extension
    for this torch now (what a first use starts in the background; ``make
    native`` runs it too). Exit status 0 when the build is in place."""
    target = cached_path()
    try:
        _wait_for(target)  # a background build of these sources under way
        if not target.exists():
            print(f"memscale: building the native region's extension into {target}", flush=True)
            _build(target)
        print(f"memscale: native region: {cached_path()}", flush=True)
        return 0
    except Exception as exc:  # noqa: BLE001 - reported, and the exit status says so
        first = str(exc).strip().splitlines()
        why = f"{type(exc).__name__}: {first[0] if first else exc}"
        print(f"memscale: the native region's extension did not build: {why}", flush=True)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.with_suffix(".failed").write_text(why + "\n")
        except OSError:
            pass
        return 1
    finally:
        marker = _marker()
        try:
            if marker.read_text().split()[0] == str(os.getpid()):
                marker.unlink()
        except (OSError, IndexError):
            pass


if __name__ == "__main__":
    raise SystemExit(_main())
