"""ctypes bindings of the DTR engine's C ABI (``memscale_dtr_*``) and a typed wrapper.

The engine (Go, packages ``evict`` and ``recompute`` behind ``cabi/engine.go``) owns
every decision: which tensor to evict, drop or swap, and which ops to re-run to
rebuild a tensor. Python reports what happened (an op ran, a reference was
dropped) and executes the engine's answers. This module only declares the
prototypes and offers :class:`Engine`, a thin typed wrapper; the region in
:mod:`memscale.dtr` calls the raw ctypes functions of :attr:`Engine.fn` on its hot
path to keep the per-op cost low.

Contract of the calls (``/tmp/memscale-contracts.md``, "C ABI of libmemscale.so"):
every int-returning call returns ``>= 0`` on success and ``-1`` on error, with the
message in ``memscale_last_error()``; ``char*`` results are freed with
``memscale_string_free``.
"""

from __future__ import annotations

import ctypes
import json
import re
import threading
from typing import Any, Final

from . import _lib
from .errors import LibraryLoadError, MemscaleError

#: ``flags`` bit of :meth:`Engine.call`: the op cannot be re-run (its outputs are
#: never evicted by dropping; they may still be swapped out).
NO_RECOMPUTE: Final[int] = 1

#: Eviction actions written by ``memscale_dtr_evict``.
ACTION_DROP: Final[int] = 0
ACTION_SWAP: Final[int] = 1

#: Plan step kinds written by ``memscale_dtr_plan``.
STEP_RERUN: Final[int] = 0
STEP_SWAP_IN: Final[int] = 1

_i64 = ctypes.c_int64
_i32 = ctypes.c_int32
_P64 = ctypes.POINTER(ctypes.c_int64)
_P32 = ctypes.POINTER(ctypes.c_int32)

# name -> (restype, argtypes) of every engine-side export.
_PROTOTYPES: Final[dict[str, tuple[Any, list[Any]]]] = {
    "memscale_dtr_create": (_i64, [ctypes.c_char_p]),
    "memscale_dtr_destroy": (ctypes.c_int, [_i64]),
    "memscale_dtr_set_budget": (ctypes.c_int, [_i64, _i64]),
    "memscale_dtr_tensor": (_i64, [_i64, _i64, _i32]),
    "memscale_dtr_call": (
        _i64,
        [_i64, ctypes.c_char_p, _P64, _i32, _P64, _P32, _i32, _i64, _i32, _P64],
    ),
    "memscale_dtr_mutate": (_i64, [_i64, ctypes.c_char_p, _P64, _i32, _P32, _i32, _i64, _i32, _P64]),
    "memscale_dtr_access": (ctypes.c_int, [_i64, _i64]),
    "memscale_dtr_lock": (ctypes.c_int, [_i64, _i64]),
    "memscale_dtr_unlock": (ctypes.c_int, [_i64, _i64]),
    "memscale_dtr_pin": (ctypes.c_int, [_i64, _i64]),
    "memscale_dtr_release": (ctypes.c_int, [_i64, _i64]),
    "memscale_dtr_evict": (_i32, [_i64, _P64, _P32, _i32]),
    "memscale_dtr_plan": (_i32, [_i64, _i64, _P32, _P64, _i32]),
    "memscale_dtr_rematerialized": (ctypes.c_int, [_i64, _i64, _i64]),
    "memscale_dtr_swapped_in": (ctypes.c_int, [_i64, _i64]),
    # char*: declared c_void_p so the pointer survives for memscale_string_free.
    "memscale_dtr_stats_json": (ctypes.c_void_p, [_i64]),
    "memscale_dtr_tune": (ctypes.c_void_p, [_i64]),
}

_lock = threading.Lock()
_declared: ctypes.CDLL | None = None


def dtr_lib() -> ctypes.CDLL:
    """The library with the ``memscale_dtr_*`` prototypes declared (cached).

    Raises:
        LibraryNotFoundError: the library file was not found.
        LibraryLoadError: it could not be loaded or lacks an engine export (a
            library built before ``cabi/engine.go`` existed).
    """
    global _declared
    if _declared is not None:
        return _declared
    with _lock:
        if _declared is not None:
            return _declared
        handle = _lib.lib()
        missing = [name for name in _PROTOTYPES if not hasattr(handle, name)]
        if missing:
            raise LibraryLoadError(
                f"{_lib.library_path()} lacks the DTR engine exports {', '.join(missing)}: "
                "rebuild it with cabi/engine.go (make lib)"
            )
        for name, (restype, argtypes) in _PROTOTYPES.items():
            fn = getattr(handle, name)
            fn.restype = restype
            fn.argtypes = argtypes
        _declared = handle
        return handle


def unavailable_reason() -> str | None:
    """``None`` when the engine exports can be loaded, else why not (test skips)."""
    try:
        dtr_lib()
    except MemscaleError as exc:
        return str(exc)
    return None


class Functions:
    """The raw ctypes functions of the engine, bound once (hot-path access).

    Attribute names drop the ``memscale_dtr_`` prefix: ``fn.call(...)`` is
    ``memscale_dtr_call(...)``. Arguments are passed exactly as the C ABI takes
    them (ctypes arrays for pointers).
    """

    __slots__ = (
        "create",
        "destroy",
        "set_budget",
        "tensor",
        "call",
        "mutate",
        "access",
        "lock",
        "unlock",
        "pin",
        "release",
        "evict",
        "plan",
        "rematerialized",
        "swapped_in",
        "stats_json",
        "tune",
    )

    def __init__(self, handle: ctypes.CDLL) -> None:
        for slot in self.__slots__:
            setattr(self, slot, getattr(handle, "memscale_dtr_" + slot))


_functions: Functions | None = None


def functions() -> Functions:
    """The engine's raw functions (loads the library on first use)."""
    global _functions
    if _functions is None:
        _functions = Functions(dtr_lib())
    return _functions


_CAP_RE: Final = re.compile(r"cap >= (\d+)")


def plan_capacity_needed(message: str) -> int | None:
    """The capacity a failed ``memscale_dtr_plan`` asks for, if that was the failure.

    The engine answers a plan longer than ``cap`` with -1 and "... call again
    with cap >= N"; any other -1 is a real error (unknown tensor, a tensor that
    cannot be rematerialized).
    """
    m = _CAP_RE.search(message)
    return int(m.group(1)) if m else None


def last_error() -> str:
    """The library's last recorded error ("" when none)."""
    return _lib.last_error()


def _fail(what: str) -> MemscaleError:
    message = last_error() or "no error message recorded"
    return MemscaleError(f"{what}: {message}")


class Engine:
    """One DTR engine instance (``memscale_dtr_create`` handle), typed.

    Args:
        config: the engine configuration (keys of the C ABI: ``budget``,
            ``heuristic``, ``recomp_time_factor``, ``recomp_memory_factor``,
            ``evictee_min_size``, ``swap_bandwidth``, ``usage``, ...). ``None``
            values are left out so the engine applies its defaults.

    Raises:
        MemscaleError: the engine rejected the configuration (the message names
            the key and value).
    """

    def __init__(self, config: dict[str, Any]) -> None:
        self.fn: Functions = functions()
        payload = json.dumps({k: v for k, v in config.items() if v is not None}).encode()
        h = int(self.fn.create(payload))
        if h <= 0:
            raise _fail(f"memscale_dtr_create({payload.decode()})")
        self.handle: int = h
        self._ids = (_i64 * 256)()
        self._acts = (_i32 * 256)()
        self._kinds = (_i32 * 256)()

    # Lifetime -------------------------------------------------------------

    def close(self) -> None:
        """Destroy the engine instance (idempotent)."""
        if self.handle > 0:
            h, self.handle = self.handle, 0
            if self.fn.destroy(h) < 0:
                raise _fail("memscale_dtr_destroy")

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check(self, rc: int, what: str) -> int:
        if rc < 0:
            raise _fail(what)
        return int(rc)

    # Registration ---------------------------------------------------------

    def set_budget(self, nbytes: int) -> None:
        """Change the budget (bytes; 0 = unlimited)."""
        self._check(self.fn.set_budget(self.handle, int(nbytes)), f"memscale_dtr_set_budget({nbytes})")

    def tensor(self, nbytes: int, pinned: bool = True) -> int:
        """Register an external tensor (input, parameter); returns its id."""
        return self._check(
            self.fn.tensor(self.handle, int(nbytes), 1 if pinned else 0), f"memscale_dtr_tensor({nbytes})"
        )

    def call(
        self,
        name: str,
        inputs: list[int],
        out_sizes: list[int],
        out_alias: list[int],
        cost_ns: int,
        flags: int = 0,
    ) -> tuple[int, list[int]]:
        """Register an op that ran; returns ``(op id, output tensor ids)``.

        ``out_alias[i]`` is ``-1`` for fresh storage or the index into ``inputs``
        whose storage output ``i`` shares.
        """
        n_in, n_out = len(inputs), len(out_sizes)
        if len(out_alias) != n_out:
            raise ValueError(f"out_alias has {len(out_alias)} entries for {n_out} outputs")
        ins = (_i64 * max(n_in, 1))(*inputs)
        sizes = (_i64 * max(n_out, 1))(*out_sizes)
        alias = (_i32 * max(n_out, 1))(*out_alias)
        outs = (_i64 * max(n_out, 1))()
        op = self._check(
            self.fn.call(self.handle, name.encode(), ins, n_in, sizes, alias, n_out, int(cost_ns), flags, outs),
            f"memscale_dtr_call({name})",
        )
        return op, list(outs[:n_out])

    def mutate(
        self, name: str, inputs: list[int], mutated: list[int], cost_ns: int, flags: int = 0
    ) -> tuple[int, list[int]]:
        """Register an in-place op; returns ``(op id, new version ids)``."""
        ins = (_i64 * max(len(inputs), 1))(*inputs)
        mut = (_i32 * max(len(mutated), 1))(*mutated)
        outs = (_i64 * max(len(mutated), 1))()
        op = self._check(
            self.fn.mutate(self.handle, name.encode(), ins, len(inputs), mut, len(mutated), int(cost_ns), flags, outs),
            f"memscale_dtr_mutate({name})",
        )
        return op, list(outs[: len(mutated)])

    def access(self, t: int) -> None:
        """Tensor ``t`` was read (staleness clock)."""
        self._check(self.fn.access(self.handle, t), f"memscale_dtr_access({t})")

    def lock(self, t: int) -> None:
        """Tensor ``t`` must not be evicted until :meth:`unlock` (counted)."""
        self._check(self.fn.lock(self.handle, t), f"memscale_dtr_lock({t})")

    def unlock(self, t: int) -> None:
        """Undo one :meth:`lock`."""
        self._check(self.fn.unlock(self.handle, t), f"memscale_dtr_unlock({t})")

    def pin(self, t: int) -> None:
        """Tensor ``t`` is never evicted."""
        self._check(self.fn.pin(self.handle, t), f"memscale_dtr_pin({t})")

    def release(self, t: int) -> None:
        """The program dropped its reference to ``t``."""
        self._check(self.fn.release(self.handle, t), f"memscale_dtr_release({t})")

    # Decisions ------------------------------------------------------------

    def evict(self) -> list[tuple[int, int]]:
        """Run the budget loop; returns ``(storage-root id, action)`` pairs.

        Calls ``memscale_dtr_evict`` until it returns 0 (usage within the budget,
        nothing left to hand out): a short answer is not the end when the engine
        ran out of candidates after taking some, and the next call then fails.

        Raises:
            MemscaleError: usage is over the budget and nothing (more) can be
                evicted; the victims of earlier calls are lost with the error,
                as the engine already counts them evicted.
        """
        out: list[tuple[int, int]] = []
        cap = len(self._ids)
        while True:
            n = self._check(self.fn.evict(self.handle, self._ids, self._acts, cap), "memscale_dtr_evict")
            if n == 0:
                return out
            out.extend(zip(self._ids[:n], self._acts[:n]))

    def plan(self, t: int) -> list[tuple[int, int]]:
        """Steps that make ``t`` resident: ``(kind, id)``, ancestors first.

        Run them in order. The engine holds (locks) the inputs of the first
        re-run step not reported yet, and only those: reporting it with
        :meth:`rematerialized` moves the hold to the next re-run step. An input
        of a later step may therefore be evicted meanwhile; rebuild it with a
        plan of its own before running that step.
        """
        while True:
            cap = len(self._kinds)
            n = int(self.fn.plan(self.handle, t, self._kinds, self._ids, cap))
            if n >= 0:
                return list(zip(self._kinds[:n], self._ids[:n]))
            need = plan_capacity_needed(last_error())
            if need is None or need <= cap:
                raise _fail(f"memscale_dtr_plan({t})")
            self._kinds = (_i32 * need)()
            self._ids = (_i64 * need)()
            self._acts = (_i32 * need)()

    def rematerialized(self, op: int, cost_ns: int) -> None:
        """Op ``op`` was re-run; its outputs are resident, except those the program
        released for good, whose re-made copies the next :meth:`evict` hands out
        (as drops) to be freed."""
        self._check(self.fn.rematerialized(self.handle, op, int(cost_ns)), f"memscale_dtr_rematerialized({op})")

    def swapped_in(self, t: int) -> None:
        """Tensor ``t`` was copied back from host memory."""
        self._check(self.fn.swapped_in(self.handle, t), f"memscale_dtr_swapped_in({t})")

    def stats(self) -> dict[str, Any]:
        """The engine's counters (``memscale_dtr_stats_json``)."""
        return _json_object(self.fn.stats_json(self.handle), "memscale_dtr_stats_json")

    def tune(self) -> dict[str, Any]:
        """The engine's choice of configuration for the steps to come
        (``memscale_dtr_tune``).

        Replays the program this engine recorded (created with ``"heuristic":
        "auto"`` or ``"record": true``) under its budget with every candidate
        configuration; runs for as long as the replays take, so call it when
        the step is over. Keys: ``config`` (the keys to merge into the next
        engine's configuration), ``choice``, ``feasible``, ``overhead``,
        ``default_overhead``, ``budget``, ``instructions``, ``wall_ns``,
        ``trials``.

        Raises:
            MemscaleError: the engine does not record, has no budget, or its
                recording could not be replayed (the message says which).
        """
        return _json_object(self.fn.tune(self.handle), "memscale_dtr_tune")


def _json_object(ptr: Any, what: str) -> dict[str, Any]:
    """The JSON object behind a ``char*`` result of ``what`` (freed), or the
    library's error when it is NULL."""
    if not ptr:
        raise _fail(what)
    if isinstance(ptr, str):  # a pure-Python stand-in (tests)
        result = json.loads(ptr)
    else:
        result = _lib.take_json(ptr, what)
    if not isinstance(result, dict):
        raise MemscaleError(f"{what} returned {type(result).__name__}, expected an object")
    return result
