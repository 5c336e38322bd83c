"""Exceptions raised by the memscale Python package.

Every error the package raises on purpose derives from :class:`MemscaleError`, so
``except memscale.MemscaleError`` catches all of them. Errors that report a bad
value also derive from :class:`ValueError` so generic validation code keeps
working.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


class MemscaleError(RuntimeError):
    """Base class of every memscale error; also what a failed library call raises.

    When raised for a failed call into ``libmemscale.so`` the message is the
    library's ``memscale_last_error()`` text.
    """


class LibraryNotFoundError(MemscaleError, FileNotFoundError):
    """``libmemscale.so`` was not found in any of the places searched.

    Attributes:
        searched: every path that was tried, in search order.
    """

    def __init__(self, searched: Sequence[Path | str], reason: str = "") -> None:
        self.searched: list[str] = [str(p) for p in searched]
        lines = "\n".join(f"  - {p}" for p in self.searched)
        head = "libmemscale.so not found"
        if reason:
            head += f" ({reason})"
        super().__init__(
            f"{head}; searched:\n{lines}\n"
            "Build it with `make lib` (writes build/libmemscale.so) or point "
            "MEMSCALE_LIBRARY at the file."
        )


class LibraryLoadError(MemscaleError):
    """The library file exists but could not be loaded or lacks a required export."""


class ConfigError(MemscaleError, ValueError):
    """A configuration value (argument or environment variable) is malformed.

    The message names the argument or variable, the value and what is accepted.
    """


class InstallError(MemscaleError):
    """``memscale.install()`` refused to swap in the allocator; nothing was changed."""


class CUDAAlreadyInitializedError(InstallError):
    """CUDA (and with it PyTorch's native caching allocator) is already initialized.

    PyTorch can only swap its allocator before the first CUDA allocation; call
    ``memscale.install()`` at the very start of the program, before any tensor is
    moved to the GPU.
    """


class AlreadyInstalledError(InstallError):
    """``install()`` was called again with different settings, or another
    pluggable allocator is already current."""


class BudgetBelowFloorError(MemscaleError):
    """A training step's budget is below the floor a step of the same shapes
    measured; raised before the step ran. ``floor``: the engine's lower bound,
    bytes; ``least``: the least threshold named (a replay of the measured
    step's program finished at it), bytes (``floor`` where none was found)."""

    def __init__(self, message: str, floor: int, least: int = 0) -> None:
        super().__init__(message)
        self.floor = floor
        self.least = least or floor
