"""The engine's per-op call without ctypes: a tiny C extension built at first use.

``memscale_dtr_op`` is called once per op (:meth:`memscale._native.engine.Engine.op`),
``memscale_dtr_ops`` once per batch of queued ops (:meth:`~memscale._native.engine.Engine.flush`).
Through ctypes that call costs about 2 us of argument conversion on the 2-core
development machine, as much as the engine's own work for an op; a CPython
extension (``crossing.c``, next to this file: four functions, linked against
nothing, reaching the engine through the address ctypes gives) halves the
whole crossing (bench/results/region-cost.md).

:func:`op_function` builds it with the C compiler Python was built with
(``sysconfig``'s ``CC``, or ``$CC``) into a cache directory
(``$MEMSCALE_CACHE_DIR``, else ``$XDG_CACHE_HOME/memscale``, else
``~/.cache/memscale``), named by the Python version and a hash of the source,
so a build happens once per machine and Python; the file is written under a
temporary name and renamed, so concurrent first uses are safe. When there is
no compiler, no ``Python.h`` or the build fails, the engine goes on through
ctypes (the same call, slower) and a log message says why, once;
``MEMSCALE_NO_EXTENSION=1`` asks for ctypes outright.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import shlex
import subprocess
import sys
import sysconfig
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from ..errors import ConfigError

log = logging.getLogger("memscale")

SOURCE: Final[Path] = Path(__file__).with_name("crossing.c")
MODULE: Final[str] = "_memscale_crossing"
DISABLE_ENV: Final[str] = "MEMSCALE_NO_EXTENSION"

_lock = threading.Lock()
_loaded: Any = None
_reason: str | None = None  # why the extension is not used (None: not tried yet or used)
_tried = False


def cache_dir() -> Path:
    """Where built extensions are kept (see the module doc)."""
    env = os.environ.get("MEMSCALE_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "memscale"


def _target() -> Path:
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    return cache_dir() / f"{MODULE}-{sys.implementation.cache_tag}-{digest}{suffix}"


def _build(target: Path) -> None:
    """Compile :data:`SOURCE` to ``target``; raises with the compiler's output."""
    cc = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    include = sysconfig.get_paths()["include"]
    if not Path(include, "Python.h").exists():
        raise RuntimeError(f"no Python.h in {include} (install the Python development headers)")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=target.name, suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        cmd = [*cc, "-O2", "-shared", "-fPIC", f"-I{include}", str(SOURCE), "-o", tmp]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _load(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(MODULE, path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _module() -> Any:
    """The built extension, or ``None`` (see :func:`unavailable_reason`)."""
    global _loaded, _reason, _tried
    with _lock:
        if not _tried:
            disable = os.environ.get(DISABLE_ENV, "").strip()
            if disable not in ("", "0", "1"):  # checked on every call until it is valid
                raise ConfigError(
                    f"{DISABLE_ENV}={disable!r}: expected 1 (call the engine through ctypes) or 0 / unset "
                    "(through the C extension, built at first use)"
                )
            _tried = True
            if disable == "1":
                _reason = f"{DISABLE_ENV}=1"
            else:
                try:
                    target = _target()
                    if not target.exists():
                        _build(target)
                    _loaded = _load(target)
                except Exception as exc:  # no compiler, no headers, a failed build or load
                    _reason = f"the C extension {SOURCE.name} could not be built or loaded: {exc}"
                    log.warning("memscale: %s; the engine is called through ctypes (about 2 us more per op)", _reason)
        return _loaded


def op_function(address: int) -> Callable[[int, bytes | None, int], int] | None:
    """The extension's ``op(handle, name, frame address)`` calling the
    ``memscale_dtr_op`` at ``address``; ``None`` when it cannot be used
    (:func:`unavailable_reason` says why; logged once)."""
    module = _module()
    if module is None:
        return None
    module.set_op(address)
    return module.op  # type: ignore[no-any-return]


def ops_function(address: int) -> Callable[[int, int], int] | None:
    """The extension's ``ops(handle, frame address)`` calling the
    ``memscale_dtr_ops`` at ``address``; ``None`` as for :func:`op_function`."""
    module = _module()
    if module is None:
        return None
    module.set_ops(address)
    return module.ops  # type: ignore[no-any-return]


def unavailable_reason() -> str | None:
    """Why :func:`op_function` returned ``None`` (``None`` if it did not, or was not called)."""
    return _reason


def reset_for_tests() -> None:
    """Forget what was tried (tests of the fallback)."""
    global _loaded, _reason, _tried
    with _lock:
        _loaded, _reason, _tried = None, None, False
