"""The share of a device budget that :func:`memscale.blocks` leaves the blocks.

With ``allocated=`` (on a GPU under the eviction threshold: the device's
allocated bytes), the budget bounds everything on the device, and the blocks'
engine gets what the rest of the program does not use, measured at every
decision (:meth:`DeviceShare.engine_budget`). Two things allocate between
those decisions, where no block hook runs:

* the *tail*: what the program allocates after the model's forward returns and
  before the blocks' backward starts - a language model's logits, the loss,
  their backward - stands beside whatever block activations are resident then.
  Measured as the allocator's watermark from the forward's end to the first
  unpack of a block's activations, it is made room for at the next step's
  forward end (the way checkpointing holds no block's activations through the
  head);
* the *transients*: a block's own temporaries in forward, the gradients its
  backward makes while its activations are resident. Measured as the
  watermark of the step's forward and backward (the tail is the tail's) against
  the budget, what went over is kept back from the blocks at the next step (the *headroom*: raised by the whole overshoot, lowered by half
  of what a step left unused; it never makes a decision fail that fits
  without it).

Measuring needs the memscale allocator (its watermark, through
:class:`~memscale._fitting.PeakProbe`, one probe at a time: forward, tail,
backward); under PyTorch's allocator nothing is measured and the share is the
budget less what is allocated outside the blocks. The first step has no
measure yet. Holds no policy: which units make room is the engine's choice.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from .._fitting import PeakProbe

#: The segments of a step whose watermark is measured, in order.
FORWARD, TAIL, BACKWARD = "forward", "tail", "backward"


class DeviceShare:
    """What a device budget leaves the blocks, learned step by step."""

    def __init__(self, allocated: Callable[[], int]) -> None:
        #: ``() -> bytes allocated on the device now``.
        self.allocated = allocated
        #: Bytes the last tail added above the allocation at the forward's end.
        self.tail = 0
        #: Bytes kept back from the blocks for what allocates between decisions.
        self.headroom = 0
        #: The open segment: its name, probe, device index and the bytes
        #: allocated when it opened.
        self._segment: tuple[str, PeakProbe, int, int] | None = None
        self._step_peaks = dict.fromkeys((FORWARD, TAIL, BACKWARD), 0)
        self._lock = threading.Lock()

    @property
    def in_tail(self) -> bool:
        """Whether the tail is being measured (checked on every unpack: cheap)."""
        segment = self._segment
        return segment is not None and segment[0] == TAIL

    def engine_budget(self, budget: int, usage: int, need: int) -> tuple[int, int]:
        """``(the blocks' engine budget, the bytes allocated outside the blocks)``
        for a device ``budget`` when the engine holds ``usage`` bytes and the
        decision needs ``need`` bytes resident (the headroom never makes a
        decision that fits without it fail)."""
        outside = max(0, self.allocated() - usage)
        room = budget - outside
        return max(1, room - self.headroom, min(room, need)), outside

    def forward_started(self, index: int) -> None:
        """A training forward of the model on CUDA device ``index`` begins."""
        if self._segment is None:
            self._open(FORWARD, index)

    def forward_ended(self, index: int) -> None:
        """The model's forward returned: the tail begins."""
        self._close()
        self._open(TAIL, index)

    def unpacked(self) -> None:
        """A block's activations were unpacked: the tail is over (if it was measured)."""
        segment = self._close(TAIL)
        if segment is not None:
            self._open(BACKWARD, segment[2])

    def step_ended(self, budget: int) -> int:
        """The step's last unit was released: update the headroom from the
        watermark of its forward and backward against ``budget``; returns the
        step's watermark, the tail's included (0: not measured)."""
        self._close()
        peaks, self._step_peaks = self._step_peaks, dict.fromkeys(self._step_peaks, 0)
        blocks = max(peaks[FORWARD], peaks[BACKWARD])
        if blocks and budget:
            over = blocks - budget
            self.headroom = self.headroom + over if over > 0 else max(0, self.headroom + over // 2)
        return max(peaks.values())

    def _open(self, name: str, index: int) -> None:
        segment = (name, PeakProbe(index), index, self.allocated())
        with self._lock:
            self._segment = segment

    def _close(self, only: str | None = None) -> tuple[str, PeakProbe, int, int] | None:
        """Close the open segment (only if it is ``only``, when given) and
        take its watermark; returns it, or None if none was closed."""
        with self._lock:
            segment = self._segment
            if segment is None or (only is not None and segment[0] != only):
                return None
            self._segment = None
        name, probe, _, start = segment
        peak = probe.close()
        if peak is not None:
            self._step_peaks[name] = max(self._step_peaks[name], peak)
            if name == TAIL:
                self.tail = max(0, peak - start)
        return segment
