"""Step boundaries: telling the memscale allocator that a training step ended.

Under a DTR budget the allocator turns each step into a placement plan for the
next one (``memscale_step_boundary``, docs/allocator-budget.md "Step plans"): a
step that repeats its large requests then remaps no granules. memscale calls
:func:`step_boundary` once per training step where it knows one ends: an
op-level region's exit (or :meth:`DTRRegion.end_step` inside an entry), and
block-level DTR's step end. It does nothing unless the memscale allocator is
PyTorch's CUDA allocator (:func:`memscale.install`), and never raises.

State: :data:`enabled` (a switch for benchmarks that compare runs without
boundaries) and whether a failure was logged.
"""

from __future__ import annotations

import logging

from .._native import lib as _lib
from .install import installed

log = logging.getLogger("memscale")

#: Whether :func:`step_boundary` tells the allocator anything (``False``: the
#: allocator places by best fit alone, as before step plans; for benchmarks).
enabled = True
_warned = False


def step_boundary(device: int | None) -> bool:
    """Tell the memscale allocator of CUDA device ``device`` that a training
    step ended and the next begins.

    Returns whether the allocator was told: ``False`` for no device (``None``:
    a model on the CPU, a region that does not count usage through the
    allocator), when the memscale allocator is not installed (a CPU run,
    PyTorch's native allocator) or :data:`enabled` is off, and when the call
    failed (logged once, never raised: a missed boundary only costs the next
    step its plan).
    """
    global _warned
    if device is None or not enabled or installed() is None:
        return False
    try:
        _lib.check(_lib.lib().memscale_step_boundary(int(device)), f"memscale_step_boundary(device={device})")
    except (RuntimeError, OSError) as exc:  # MemscaleError is a RuntimeError
        if not _warned:
            _warned = True
            log.warning("memscale: the allocator was not told a step ended (%s); its step plans wait", exc)
        return False
    return True
