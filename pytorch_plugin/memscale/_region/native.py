"""The native region: an entry whose per-op path is the C++ extension.

:class:`NativeSession` stands where :class:`~.session.Session` stands for a
Python entry, and :class:`NativeMode` where :class:`~.mode.RegionMode` does:
the region (:class:`~.region.DTRRegion`) creates one of each per entry when
:func:`use_native` says so. Python keeps the engine's lifetime
(:class:`~memscale._native.engine.Engine`: create, stats, tuning, destroy)
and the exit's hand-back of escaping tensors; every op, eviction and rebuild
happens in C++ (``memscale/_native/csrc/session.h``). Accumulated gradients
are pinned through a hook per leaf that calls into C++
(:func:`_pin_accumulated_gradients`, ``csrc/grad_pin.h``).

What the native path does not do yet chooses the Python region at entry
(never in the middle of a step): a trace recorder (``sink``). A backward pass
that raised ends the drop-in step as on the Python path
(:attr:`NativeMode.watch_backward`); an allocation that fails asks the session
to evict (:meth:`NativeSession.reclaim`, the allocator's reclaimer).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from .._native import lib as _lib
from .._native import region_ext
from .._native.engine import Engine, NoRoomError
from ..errors import MemscaleError
from . import reclaim
from .device import sync_count
from .tensor import hand_back

if TYPE_CHECKING:
    from .state import RegionSettings

log = logging.getLogger("memscale")

_warned = False

#: Op costs the engine hears on the native path, for tests: (nanoseconds per
#: op, seed). (0, 0) measures them (the default); (n, 0) makes every op cost n,
#: as the Python path's tests patch its clock; (n, seed) draws each cost from
#: [1, 2n] with that seed (``_native/csrc/op_clock.h``).
TEST_OP_COST: tuple[int, int] = (0, 0)
#: For tests on the CPU: ops timed with device events that each say this
#: many nanoseconds, as CUDA's would (0: only CUDA results are timed so).
TEST_DEVICE_NS: int = 0


def use_native(region: RegionSettings, sink: Any) -> bool:
    """Whether an entry of ``region`` runs on the native path.

    ``MEMSCALE_NATIVE=1`` requires it (an error says why it cannot be used),
    ``0`` refuses it; unset, it is used when the extension builds and loads
    and the entry needs nothing it lacks, else the Python path is, with one
    warning per process when the extension is what failed.

    Raises:
        MemscaleError: ``MEMSCALE_NATIVE=1`` and the native region cannot run
            this entry.
    """
    global _warned
    wanted = region_ext.choice()
    if wanted is False:
        return False
    lacking = _lacking(region, sink)
    if lacking is not None:
        if wanted:
            raise MemscaleError(f"MEMSCALE_NATIVE=1: the native region does not support {lacking} yet; unset it")
        return False
    if region_ext.extension() is None:
        reason = region_ext.unavailable_reason()
        if wanted:
            raise MemscaleError(f"MEMSCALE_NATIVE=1: the native region's extension cannot be used: {reason}")
        if not _warned:
            _warned = True
            log.warning(
                "memscale: the native region's extension cannot be used (%s); using the Python region, whose "
                "per-op bookkeeping costs about 10x more CPU time (set MEMSCALE_NATIVE=0 to silence this)",
                reason,
            )
        return False
    _read_data_through_wrappers()
    _pin_accumulated_gradients()
    return True


_patched = False
_hooking = False


def _pin_accumulated_gradients() -> None:
    """Have the sessions pin each leaf's gradient once autograd accumulates
    it, as the Python region does (``externals.py``'s ``_pin_gradient``):
    gradients outlive the step, and evicting one would mean re-running the
    backward pass that made it.

    Once per process, the extension is given the callable that registers the
    hook on the leaves a session hands it (``csrc/grad_pin.h``): the leaves it
    notes that no session handed over before, once per leaf for the process's
    life, at the end of the op that found them. The hook is the extension's
    ``pin_gradient`` itself, registered through
    ``register_post_accumulate_grad_hook`` beside the program's own hooks
    (PyTorch has one C++ slot per tensor, which Python's hooks share); it
    does nothing for a plain gradient or one of a closed session, so a leaf
    outside any entry pays one call per accumulation.
    """
    global _hooking
    if _hooking:
        return
    ext = region_ext.extension()
    assert ext is not None
    pin = ext.pin_gradient

    def hook_leaves(leaves: list[torch.Tensor]) -> None:
        for leaf in leaves:
            try:
                leaf.register_post_accumulate_grad_hook(pin)
            except RuntimeError:
                pass  # no longer a leaf that requires grad: no gradient accumulates in it

    ext.set_leaf_hooker(hook_leaves)
    _hooking = True


def _read_data_through_wrappers() -> None:
    """Let the few tensor methods that read data without an op (``tolist``,
    ``numpy``, printing) read a native region tensor's real tensor, the
    legacy constructor ``new`` work on one, and ``copy.deepcopy`` of one give
    a plain tensor.

    A native wrapper has no storage of its own; every op on it reaches the
    region, but ``Tensor.tolist``, ``Tensor.numpy`` and ``repr`` read the data
    pointer directly. Each is wrapped once per process to pass the real
    tensor (rebuilt if evicted) for a wrapper and the tensor itself otherwise.
    """
    global _patched
    if _patched:
        return
    ext = region_ext.extension()
    assert ext is not None
    unwrap = ext.unwrap
    import torch._tensor_str as tensor_str

    def reading(method: Any) -> Any:
        def read(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            return method(unwrap(self), *args, **kwargs)

        read.__name__ = getattr(method, "__name__", "read")
        read.__doc__ = getattr(method, "__doc__", None)
        return read

    torch.Tensor.tolist = reading(torch.Tensor.tolist)  # type: ignore[method-assign]
    torch.Tensor.numpy = reading(torch.Tensor.numpy)  # type: ignore[method-assign]
    tensor_str._str = reading(tensor_str._str)

    # The legacy constructor (x.new(*sizes)) derives a device from the
    # tensor's dispatch key, which PrivateUse2 has none of: it is given a
    # plain tensor of the same dtype and device instead (no data read).
    is_wrapper = ext.is_wrapper
    legacy_new = torch.Tensor.new

    def new(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if is_wrapper(self):
            with _key_off(ext):  # a plain stand-in: factories inside an entry make region tensors
                self = torch.empty(0, dtype=self.dtype, device=self.device)
        return legacy_new(self, *args, **kwargs)

    torch.Tensor.new = new  # type: ignore[method-assign]

    # A deep copy is a snapshot the program keeps: a plain tensor, as the
    # Python region's (DTRTensor.__deepcopy__), copied outside the region.
    legacy_deepcopy = torch.Tensor.__deepcopy__

    def deepcopy(self: torch.Tensor, memo: dict[int, Any]) -> torch.Tensor:
        if not is_wrapper(self):
            return legacy_deepcopy(self, memo)  # type: ignore[no-any-return]
        real = unwrap(self)
        with _key_off(ext):
            copied = real.clone()
        memo[id(self)] = copied
        return copied  # type: ignore[no-any-return]

    torch.Tensor.__deepcopy__ = deepcopy  # type: ignore[method-assign]
    _patched = True


@contextlib.contextmanager
def _key_off(ext: Any) -> Iterator[None]:
    """The region's key off on this thread meanwhile: ops reach the kernels,
    not a session (an open one, or one that just closed)."""
    was = ext.set_included(False)
    try:
        yield
    finally:
        ext.set_included(was)


def _lacking(region: RegionSettings, sink: Any) -> str | None:
    if sink is not None:
        return "trace recording (memscale record)"
    return None


class NativeSession:
    """One native entry: the engine instance and the C++ session on it."""

    def __init__(self, region: RegionSettings, config: dict[str, Any]) -> None:
        ext = region_ext.extension()
        assert ext is not None
        self.region = region
        self.config = config
        self.engine = Engine(config)
        self.status = self.engine.status
        self.tuning: dict[str, Any] | None = None
        self.tune_error: str | None = None
        self.nested_restarts = 0
        self.sync_mark = sync_count()
        self._sync_end: int | None = None
        usage_address = 0
        if config.get("usage") == "allocator":
            usage_address = int(_lib.lib().memscale_allocated_address(int(config.get("device") or 0)) or 0)
        budgeted = int(config.get("budget") or 0) > 0 or bool(config.get("stress"))
        self.native = ext.Session(
            self.engine.handle,
            region_ext.library_path(),
            budgeted,
            region.recompute,
            usage_address,
            region.verify_where is not None,
            *TEST_OP_COST,
            TEST_DEVICE_NS,
        )
        self.closed = False
        #: The device whose allocation failures this session evicts for
        #: (:mod:`.reclaim`), and how many it could not help with because
        #: another thread was inside it.
        self.reclaims_for = reclaim.device_of(config)
        self.reclaims_refused = 0
        if self.reclaims_for is not None:
            reclaim.register(self, self.reclaims_for)

    def reclaim(self, need: int) -> int:
        """An allocation failed for ``need`` bytes: evict about that much,
        whatever the budget; returns the bytes of the storages freed. The
        inputs of the op under way are locked, so never chosen; another
        thread inside the session gets 0 (see the Python session's reclaim)."""
        if self.closed or need <= 0:
            return 0
        freed = int(self.native.reclaim(need))
        if freed < 0:
            reclaim.refused(self, need)
            return 0
        return freed

    def set_budget(self, budget: int) -> None:
        """Change the running entry's budget (bytes, 0 = unlimited)."""
        self.native.flush()  # the registrations queued without a budget reach the engine first
        self.engine.set_budget(budget)
        self.native.set_budgeted(budget > 0 or bool(self.config.get("stress")))

    def synchronizations(self) -> int:
        """How many times the entry's code waited for the device (the Python
        side's, and the C++ session's host reads: verified rebuilds)."""
        end = self._sync_end if self._sync_end is not None else sync_count()
        return end - self.sync_mark + int(self.native.counters()["synchronizations"])

    def counters(self) -> dict[str, int]:
        """The native path's own counters (ops, re-runs, predictions...)."""
        return dict(self.native.counters())

    def close(self, ok: bool) -> dict[str, Any]:
        """Make what escapes resident, hand it back, destroy the engine; returns its stats."""
        stats: dict[str, Any] = {}
        try:
            try:
                handed = self.native.close(ok)
            except NoRoomError as exc:
                # What leaves the step does not fit: the error carries the
                # step's stats (its minimum budget is the one it names), as
                # the Python session's does; the region's exit records them.
                exc.stats = self.engine.stats()  # type: ignore[attr-defined]
                raise
            self.nested_restarts = int(self.native.counters()["nested_restarts"])
            stats = self.engine.stats()
            if ok and stats.get("auto"):
                try:
                    self.tuning = self.engine.tune()
                except MemscaleError as exc:
                    self.tune_error = str(exc)
        finally:
            self.closed = True
            if self.reclaims_for is not None:
                reclaim.unregister(self, self.reclaims_for)
            self._sync_end = sync_count()
            self.engine.close()
        # A view's wrapper references its base's: go round until a round hands back nothing.
        # Inside a running entry (end_step) the region's key is still on: the
        # hand-back's ops must not reach this closed session.
        ext = region_ext.extension()
        assert ext is not None
        with _key_off(ext):
            pending = list(handed)
            while pending:
                left = [(w, t) for w, t in pending if not hand_back(w, t)]
                if len(left) == len(pending):
                    break
                pending = left
        return stats


class NativeMode:
    """The native region's switch on this thread: the region key in the
    thread-local include set and the session active while entered."""

    def __init__(self, session: NativeSession) -> None:
        self._session = session
        self._was_included = False
        self._watch_backward = False

    @property
    def session(self) -> NativeSession:
        """The entry's session (replaced by :meth:`DTRRegion.end_step`)."""
        return self._session

    @session.setter
    def session(self, fresh: NativeSession) -> None:
        ext = region_ext.extension()
        assert ext is not None
        ext.leave(self._session.native, self._was_included)
        self._session = fresh
        fresh.native.watch_backward = self._watch_backward
        self._was_included = ext.enter(fresh.native)

    def __enter__(self) -> NativeMode:
        ext = region_ext.extension()
        assert ext is not None
        self._was_included = ext.enter(self._session.native)
        return self

    def __exit__(self, *exc: object) -> None:
        ext = region_ext.extension()
        assert ext is not None
        ext.leave(self._session.native, self._was_included)

    @property
    def suspended(self) -> bool:
        """While set, ops run as outside the region (the optimizer's update)."""
        return bool(self._session.native.suspended)

    @suspended.setter
    def suspended(self, on: bool) -> None:
        ext = region_ext.extension()
        assert ext is not None
        self._session.native.suspended = on
        ext.set_included(not on)

    @property
    def watch_backward(self) -> bool:
        """Whether a backward pass of the entry that raised ends the step
        (``DTRRegion.ends_on_failed_backward``; watched in C++ per op,
        ``_native/csrc/backward_watch.h``)."""
        return self._watch_backward

    @watch_backward.setter
    def watch_backward(self, on: bool) -> None:
        self._watch_backward = on
        self._session.native.watch_backward = on

    def backward_failure(self) -> BaseException | None:
        """An error when a watched backward pass of the entry raised (the
        program caught it: the step is over, every op after it ran as outside
        the region); else ``None``."""
        if self._watch_backward and self._session.native.backward_failed():
            return MemscaleError("the step's backward pass raised (the error went to the program)")
        return None


def is_native_tensor(t: Any) -> bool:
    """Whether ``t`` is a tensor of a native region."""
    ext = region_ext.loaded()  # none of its tensors exist before it is loaded
    return ext is not None and isinstance(t, torch.Tensor) and bool(ext.is_wrapper(t))


def unwrap_native(t: torch.Tensor) -> torch.Tensor:
    """The plain tensor behind a native region tensor (rebuilt if evicted)."""
    ext = region_ext.extension()
    assert ext is not None
    return ext.unwrap(t)  # type: ignore[no-any-return]


__all__ = ["NativeMode", "NativeSession", "is_native_tensor", "unwrap_native", "use_native"]
