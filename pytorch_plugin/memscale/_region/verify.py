"""Verifying rebuilds: every re-run must give bitwise what the first run gave.

A region with verification on (what :func:`memscale.check` runs) keeps a
fingerprint of each fresh tensor when it is first computed and compares the
rebuilt tensor with it after every re-run. The first difference raises
:class:`RebuildMismatch`, naming the op and where in the program it first ran
(the module path a :class:`Where` callback reports).

A fingerprint is two reductions of the tensor's bits read as integers
(their XOR and their wrapping sum), so it costs a pass over the data and no
copy that lives on. Holds no policy; used only when verification is on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import torch

from ..errors import MemscaleError
from .device import host_int

#: Says where in the program the running op is (a module path), or "".
Where = Callable[[], str]

#: The integer dtype of each element size, to read any tensor's bits.
_BITS: Final[dict[int, torch.dtype]] = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class RebuildMismatch(MemscaleError):
    """A rebuilt tensor differs from what the op first computed.

    Attributes:
        where: the module path the op first ran in ("" when outside any).
    """

    def __init__(self, message: str, where: str) -> None:
        super().__init__(message)
        self.where = where


def fingerprint(t: torch.Tensor) -> tuple[Any, ...]:
    """A summary of ``t``'s bits (same tensor -> same fingerprint)."""
    flat = t.detach().contiguous()
    if flat.is_complex():
        flat = torch.view_as_real(flat)
    flat = flat.reshape(-1)
    if flat.numel() == 0:
        return (tuple(t.shape), t.dtype)
    bits = flat.view(_BITS[flat.element_size()]) if flat.dtype != torch.bool else flat.view(torch.uint8)
    wide = bits.to(torch.int64)
    parts: list[Any] = [tuple(t.shape), t.dtype, host_int(wide.sum())]
    hash_tensor = getattr(torch, "hash_tensor", None)
    if hash_tensor is not None:
        parts.append(host_int(hash_tensor(wide).view(torch.int64)))
    return tuple(parts)


class Verifier:
    """Fingerprints of a session's fresh tensors and where their ops ran."""

    __slots__ = ("where", "prints", "places")

    def __init__(self, where: Where) -> None:
        self.where = where
        self.prints: dict[Any, tuple[Any, ...]] = {}
        self.places: dict[int, str] = {}

    def computed(self, op_id: int, cells: list[Any]) -> None:
        """An op ran for the first time: fingerprint its outputs."""
        self.places[op_id] = self.where()
        for cell in cells:
            if cell.tensor is not None and cell.root == cell.tensor_id:
                self.prints[cell] = fingerprint(cell.tensor)

    def rebuilt(self, op_id: int, label: str, cells: list[Any]) -> None:
        """``op_id`` was re-run: its outputs must match their fingerprints."""
        for k, cell in enumerate(cells):
            expected = self.prints.get(cell)
            if expected is None or cell.tensor is None:
                continue
            if fingerprint(cell.tensor) != expected:
                place = self.places.get(op_id, "")
                raise RebuildMismatch(
                    f"memscale.check: re-running {label} (in {place or 'no module'}) gave different values "
                    f"for its output {k} than its first run; this op cannot be rematerialized bitwise",
                    place,
                )
