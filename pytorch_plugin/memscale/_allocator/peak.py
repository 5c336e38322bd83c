"""The device's allocated-bytes peak over a stretch of a program, from the
memscale allocator's watermark (read through an engine that registers nothing).

Used to measure untracked steps (:mod:`memscale._dropin.fitting`) and the
segments of a step under block-level DTR (:mod:`memscale._blocks.device`).
Holds no state beyond the open probe.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

log = logging.getLogger("memscale")


class PeakProbe:
    """The device's allocated-bytes peak from now until :meth:`close`, read
    from the memscale allocator through an engine that registers nothing
    (``None`` when the allocator is not installed or the device is the CPU):
    over an untracked step, or over what follows a model's forward under
    :func:`memscale.blocks` (``device``: its index, default the current one)."""

    def __init__(self, device: int | None = None) -> None:
        self._engine: Any = None
        if not torch.cuda.is_available():
            return
        try:
            from .install import installed

            if installed() is None:
                return
            from .._native.engine import Engine

            self._engine = Engine(
                {
                    "defaults": "region",
                    "budget": 0,
                    "usage": "allocator",
                    "device": torch.cuda.current_device() if device is None else device,
                }
            )
        except Exception as exc:  # a probe that cannot start measures nothing
            log.debug("memscale: no peak probe for an untracked step: %s", exc)
            self._engine = None

    def close(self) -> int | None:
        """The peak since the probe started, in bytes (``None``: not measured)."""
        engine, self._engine = self._engine, None
        if engine is None:
            return None
        try:
            return int(engine.stats().get("peak_usage", 0))
        finally:
            engine.close()
