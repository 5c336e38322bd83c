"""The native region's torch extension: built at first use, cached, or refused.

The region's per-op path is C++ (``csrc/``, a torch extension: see
``csrc/session.h`` for the design). :func:`extension` builds it with
``torch.utils.cpp_extension.load`` the first time a process asks for it and
keeps the build in the memscale cache directory (``$MEMSCALE_CACHE_DIR``,
else ``$XDG_CACHE_HOME/memscale``, else ``~/.cache/memscale``) under a name
made of torch's version, its C++ ABI and the Python version: a new torch
builds anew, a changed source recompiles what changed (torch's loader hashes
the sources), everything else loads the cached module (a fraction of a
second).

``MEMSCALE_NATIVE`` chooses: ``1`` requires the native region (a failed build
or load is an error), ``0`` uses the Python region, unset uses the native one
when it builds and loads and the Python one otherwise, with one warning that
says why and what it costs.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Final

from ..errors import ConfigError, MemscaleError
from .crossing import cache_dir

log = logging.getLogger("memscale")

#: The variable that forces the native region on (1) or off (0).
NATIVE_ENV: Final[str] = "MEMSCALE_NATIVE"
SOURCES_DIR: Final[Path] = Path(__file__).with_name("csrc")

_lock = threading.Lock()
_module: ModuleType | None = None
_reason: str | None = None
_tried = False


def choice() -> bool | None:
    """``MEMSCALE_NATIVE``: True (1), False (0) or None (unset: automatic).

    Raises:
        ConfigError: it is set to anything else.
    """
    raw = os.environ.get(NATIVE_ENV, "").strip()
    if raw == "":
        return None
    if raw in ("0", "1"):
        return raw == "1"
    raise ConfigError(f"{NATIVE_ENV}={raw!r}: expected 1 (the native region) or 0 (the Python region), or unset")


def _sources() -> list[Path]:
    return sorted(SOURCES_DIR.glob("*.cpp"))


def build_name() -> str:
    """The cache name of the build for this torch, C++ ABI and Python (a changed
    source is rebuilt in place: torch's loader hashes the sources and ninja
    recompiles what changed)."""
    import torch

    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    version = torch.__version__.replace("+", "_").replace(".", "_")
    tag = sys.implementation.cache_tag.replace("-", "_")
    return f"memscale_region_t{version}_abi{abi}_{tag}"


def _load() -> ModuleType:
    from torch.utils import cpp_extension

    from . import lib as _lib

    name = build_name()
    directory = cache_dir() / "torch-extensions" / name
    directory.mkdir(parents=True, exist_ok=True)
    _lib.lib()  # the engine's library must be loaded before the extension binds to it
    module = cpp_extension.load(
        name=name,
        sources=[str(p) for p in _sources()],
        build_directory=str(directory),
        extra_cflags=["-O2"],
        verbose=os.environ.get("MEMSCALE_DEBUG") == "1",
    )
    reason = module.install()
    if reason:
        raise MemscaleError(reason)
    return module


def extension() -> ModuleType | None:
    """The native region's module, built or loaded at the first call; ``None``
    when it cannot be used (:func:`unavailable_reason` says why)."""
    global _module, _reason, _tried
    if _tried:
        return _module
    with _lock:
        if _tried:
            return _module
        try:
            _module = _load()
        except Exception as exc:  # noqa: BLE001 - any build or load failure means: use the Python region
            first = str(exc).strip().splitlines()
            _reason = f"{type(exc).__name__}: {first[0] if first else exc}"
            _module = None
        _tried = True
        return _module


def unavailable_reason() -> str | None:
    """Why the native region cannot be used (``None``: it can, or was not tried)."""
    return _reason


def library_path() -> str:
    """The engine library the extension binds to."""
    from . import lib as _lib

    return str(_lib.library_path())
