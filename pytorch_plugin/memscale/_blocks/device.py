"""The share of a device budget that :func:`memscale.blocks` leaves the blocks.

With ``allocated=`` (on a GPU under the eviction threshold: the device's
allocated bytes), the budget bounds everything on the device, and the blocks'
engine gets what the rest of the program does not use, measured at every
decision (:meth:`DeviceShare.engine_budget`). Two things allocate between
those decisions, where no block hook runs:

* the *tail*: what the program allocates after the forward's last block
  returns and before the blocks' backward starts - a language model's head,
  its logits, the loss, their backward - stands beside whatever block
  activations are resident then. Measured as the allocator's watermark from
  the last block's return to the first unpack of a block's activations, it is
  made room for when the next step's last block returns (the way checkpointing
  holds no block's activations through the head). Which call is the last is
  learned (the number of block calls of the previous forward); until it is
  known, the tail is measured from the model's forward's end, counting from
  the bytes allocated when the last block returned and the forward's
  watermark in (an overestimate when the forward peaked inside its blocks,
  corrected the next step);
* the *transients*: a block's own temporaries in forward, the gradients its
  backward makes while its activations are resident. Measured as the
  watermark of the step's forward (when its tail started at the last block, so
  that the head is not in it) and of its backward (until the last unit is
  released: not the optimizer's step) against the budget, what went over is
  kept back from the blocks at the next step (the *headroom*: raised by the whole overshoot, lowered by half
  of what a step left unused; it never makes a decision fail that fits
  without it).

Measuring needs the memscale allocator (its watermark, through
:class:`~memscale._allocator.peak.PeakProbe`, one probe at a time: forward, tail,
backward); under PyTorch's allocator nothing is measured and the share is the
budget less what is allocated outside the blocks. The first step has no
measure yet. Holds no policy: which units make room is the engine's choice.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from .._allocator.peak import PeakProbe

log = logging.getLogger("memscale")

#: The segments of a step whose watermark is measured, in order.
FORWARD, TAIL, BACKWARD = "forward", "tail", "backward"


class DeviceShare:
    """What a device budget leaves the blocks, learned step by step.

    The tracker reports the step's events in order: :meth:`forward_started`,
    :meth:`tail_started`, :meth:`unpacked` (every unpack; the first ends the
    tail), :meth:`backward_done`, :meth:`step_ended`.
    """

    def __init__(self, allocated: Callable[[], int]) -> None:
        #: ``() -> bytes allocated on the device now``.
        self.allocated = allocated
        #: Bytes the last tail added above the allocation where it started.
        self.tail = 0
        #: Bytes kept back from the blocks for what allocates between decisions.
        self.headroom = 0
        #: The open segment: its name, probe, device index and the bytes
        #: allocated when it opened.
        self._segment: tuple[str, PeakProbe, int, int] | None = None
        self._step_peaks = dict.fromkeys((FORWARD, TAIL, BACKWARD), 0)
        #: Whether this step's tail started at its last block (its forward's
        #: watermark then leaves the head out).
        self._tail_at_last_block = False
        #: Bytes allocated when the last block call returned (see block_returned).
        self._after_block = 0
        #: The forward's watermark, when it holds the head (see tail_started).
        self._tail_floor = 0
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
        """A training forward of the model on CUDA device ``index`` begins
        (a tail or backward still open - a forward whose backward never came,
        a second micro-batch - is closed first)."""
        segment = self._segment
        if segment is not None and segment[0] != FORWARD:
            self._close()
        if self._segment is None:
            self._open(FORWARD, index)

    def block_returned(self) -> None:
        """A block call of the forward returned (its allocation is the tail's
        start if it turns out to be the last)."""
        self._after_block = self.allocated()

    def tail_started(self, index: int, at_last_block: bool) -> None:
        """The forward's last block returned (``at_last_block``), or the model's
        forward did without a tail started: the tail begins."""
        if self.in_tail:
            return
        forward = self._close(FORWARD)
        self._close()  # a backward left open
        self._tail_at_last_block = at_last_block
        # Started at the forward's end, the tail's head ran in the forward's
        # segment: count its watermark in, from the last block's return.
        head_in_forward = not at_last_block and forward is not None
        self._tail_floor = self._step_peaks[FORWARD] if head_in_forward else 0
        self._open(TAIL, index, self._after_block if head_in_forward else None)

    def unpacked(self) -> None:
        """A block's activations were unpacked: the tail is over (if it was measured)."""
        segment = self._close(TAIL)
        if segment is not None:
            self._open(BACKWARD, segment[2])

    def backward_done(self) -> None:
        """Autograd released the step's last unit: its backward is over."""
        self._close(BACKWARD)

    def step_ended(self, budget: int) -> int:
        """The step is over: update the headroom from the watermark of its
        forward and backward against ``budget``; returns the step's watermark,
        the tail's included (0: not measured)."""
        self._close(BACKWARD)
        peaks, self._step_peaks = self._step_peaks, dict.fromkeys(self._step_peaks, 0)
        blocks = max(peaks[FORWARD] if self._tail_at_last_block else 0, peaks[BACKWARD])
        if blocks and budget:
            over = blocks - budget
            self.headroom = self.headroom + over if over > 0 else max(0, self.headroom + over // 2)
        log.debug("memscale.blocks: step watermarks %s against a budget of %d: tail %d, headroom %d",
                  peaks, budget, self.tail, self.headroom)
        return max(peaks.values())

    def _open(self, name: str, index: int, start: int | None = None) -> None:
        """Open segment ``name`` from ``start`` bytes allocated (default: now)."""
        segment = (name, PeakProbe(index), index, self.allocated() if start is None else start)
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
                self.tail = max(0, max(peak, self._tail_floor) - start)
        return segment
