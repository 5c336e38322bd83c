"""Configuration of the drop-in API and size parsing shared by the package.

Sizes (thresholds, limits, caps) are accepted as an ``int`` number of bytes, a
string with a unit (``"512MiB"``, ``"12GiB"``, ``"1.5GB"``; binary units KiB/MiB/
GiB/TiB are powers of 1024, decimal units KB/MB/GB/TB powers of 1000, ``B`` or no
unit means bytes), or a percentage of device memory (``"75%"``). Python only
converts these to bytes; every eviction decision is made by the Go engine.

What "device memory" means for percentages:

* on a GPU: the card's total memory (``torch.cuda.get_device_properties``, or the
  library's own view of the device before CUDA is initialized);
* on CPU (the DTR region on CPU tensors, used for tests and for sizing runs):
  ``Config.device_memory`` when given, otherwise the measured peak usage of a
  baseline step. The wrappers in :mod:`memscale._dropin.api` run the first step with no
  budget, read its peak from the region summary and budget every later step at
  ``budget_for(peak)``.
"""

from __future__ import annotations

import enum
import math
import os
import re
from fractions import Fraction
from dataclasses import dataclass, fields
from typing import Final, Literal

from .errors import ConfigError

Mode = Literal["conservative", "balanced", "aggressive"]

class OptimizationMode(str, enum.Enum):
    """The modes of memscale 0.1 (``Config(mode=OptimizationMode.BALANCED)``);
    equal to the strings ``"conservative"``, ``"balanced"``, ``"aggressive"``."""

    CONSERVATIVE = "conservative"
    BALANCED = "balanced"
    AGGRESSIVE = "aggressive"


#: The largest ``recomp_time_factor`` / ``recomp_memory_factor`` the engine
#: accepts (evict.MaxRecompFactor).
MAX_RECOMP_FACTOR: Final[int] = 8

#: Bytes of one ``max_cpu_offload_gb`` unit (GiB).
GB: Final[int] = 1024**3

#: The mode of a Config that names none and runs where no threshold is set.
DEFAULT_MODE: Final[str] = "balanced"

#: Fraction of device memory each mode uses as the eviction threshold / budget.
MODE_FRACTIONS: Final[dict[str, float]] = {
    "conservative": 0.90,
    "balanced": 0.75,
    "aggressive": 0.50,
}



def heuristics() -> tuple[str, ...] | None:
    """The heuristic names the engine accepts, as the library reports them
    (``memscale_config_json``'s ``heuristics``), or ``None`` when the library
    cannot be loaded or configured - the engine then validates the name when a
    region is created. There is deliberately no copy of the list here."""
    global _HEURISTICS
    if _HEURISTICS is None:
        from ._native import lib as _lib  # the library is optional for building a Config

        try:
            report = _lib.take_json(_lib.lib().memscale_config_json(), "memscale_config_json")
        except Exception:  # noqa: BLE001 - any failure means "cannot ask the engine"
            return None
        names = report.get("heuristics") if isinstance(report, dict) else None
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            return None
        _HEURISTICS = tuple(names)
    return _HEURISTICS


_HEURISTICS: tuple[str, ...] | None = None


def check_heuristic(value: object, where: str) -> None:
    """Raises ConfigError naming ``where`` when ``value`` is not a heuristic the
    engine accepts (``None`` means the engine's default and is always fine)."""
    if value is None:
        return
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}={value!r}: expected a heuristic name or None (engine default)")
    known = heuristics()
    if known is not None and value not in known:
        raise ConfigError(f"{where}={value!r}: expected one of {', '.join(known)} or None (engine default)")

_UNITS: Final[dict[str, int]] = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
# The same grammar as the library's (internal/config): digits, an optional
# fraction with at least one digit, an optional unit; no sign, no exponent.
_SIZE_RE: Final = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")
_PERCENT_RE: Final = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*%\s*$")

SizeLike = int | str

_ACCEPTED_BYTES: Final[str] = (
    'a number of bytes (e.g. 1073741824) or a size with a unit (e.g. "512MiB", '
    '"12GiB", "1.5GB"; units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)'
)
#: Human description of what :func:`parse_size` accepts (used in error messages).
ACCEPTED_SIZES: Final[str] = _ACCEPTED_BYTES + ', or a percentage of device memory (e.g. "75%")'


def is_percentage(value: SizeLike | None) -> bool:
    """Report whether ``value`` is a percentage string such as ``"75%"``."""
    return isinstance(value, str) and _PERCENT_RE.match(value) is not None


def parse_size(
    value: SizeLike,
    *,
    name: str,
    total: int | None = None,
    allow_percent: bool = True,
) -> int:
    """Convert a size to bytes.

    Args:
        value: bytes as ``int``, ``"12GiB"``-style string or ``"75%"``.
        name: what is being parsed (argument, field or environment variable);
            it is named in the error message.
        total: the device memory a percentage is relative to. Required when
            ``value`` is a percentage.
        allow_percent: whether percentages are accepted at all.

    Returns:
        The size in bytes (``>= 0``).

    Raises:
        ConfigError: the value is malformed, negative, a percentage outside
            (0, 100], or a percentage with no ``total`` to resolve it against.
    """
    accepted = ACCEPTED_SIZES if allow_percent else _ACCEPTED_BYTES
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(f"{name}={value!r}: expected {accepted}")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"{name}={value!r}: must not be negative; expected {accepted}")
        if value >= 2**63:
            raise ConfigError(f"{name}={value!r}: too large (at most 2**63-1 bytes)")
        return value
    if value.strip().startswith("-"):
        raise ConfigError(f"{name}={value!r}: must be positive (a size cannot be negative); expected {accepted}")
    pm = _PERCENT_RE.match(value)
    if pm is not None:
        if not allow_percent:
            raise ConfigError(f"{name}={value!r}: a percentage is not accepted here; expected {accepted}")
        pct = Fraction(pm.group(1))
        if pct > 100:
            raise ConfigError(
                f"{name}={value!r}: {pm.group(1)}% is over 100 %: a percentage is of the whole memory, so "
                "at most 100%; give a percentage in (0, 100] or bytes"
            )
        if pct <= 0:
            raise ConfigError(f"{name}={value!r}: a percentage must be above 0; give one in (0, 100] or bytes")
        if total is None:
            raise ConfigError(f"{name}={value!r}: a percentage needs the device memory size, which is not known here")
        if total <= 0:
            raise ConfigError(f"{name}={value!r}: device memory size {total} is not positive")
        return int(total * pct / 100)  # floor, exact like the library's
    m = _SIZE_RE.match(value)
    if m is None or m.group(2).lower() not in _UNITS:
        raise ConfigError(f"{name}={value!r}: expected {accepted}")
    unit = _UNITS[m.group(2).lower()]
    if unit == 1 and "." in m.group(1):
        raise ConfigError(f"{name}={value!r}: a fraction of a byte; expected {accepted}")
    result = int(Fraction(m.group(1)) * unit)  # floor, exact like the library's
    if result >= 2**63:
        raise ConfigError(f"{name}={value!r}: too large (at most 2**63-1 bytes)")
    return result


def format_bytes(n: int | float) -> str:
    """Render a byte count with a binary unit (``"1.50 GiB"``)."""
    value = float(n)
    sign = "-" if value < 0 else ""
    value = abs(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{sign}{value:.0f} {unit}" if unit == "B" else f"{sign}{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


#: The environment variable that chooses :attr:`Config.unit` when it is not given.
UNIT_ENV = "MEMSCALE_UNIT"

#: The values of :attr:`Config.unit`.
UNITS = ("op", "block", "auto")


def unit_from_env() -> str:
    """``MEMSCALE_UNIT``: ``op`` (unset or empty: the default), ``block`` or ``auto``.

    Raises:
        ConfigError: another value.
    """
    raw = os.environ.get(UNIT_ENV, "").strip()
    if raw in ("", *UNITS):
        return raw or "op"
    raise ConfigError(
        f"{UNIT_ENV}={raw!r}: expected op (every ATen op in a region, the default), block "
        "(memscale.blocks: whole blocks' activations, no per-op cost) or auto (block for a model with "
        "repeated blocks, op for one without)"
    )


@dataclass(frozen=True)
class Config:
    """Settings of :func:`memscale.wrap` / :func:`memscale.optimize`.

    Attributes:
        mode: ``"conservative"``, ``"balanced"`` or ``"aggressive"``: the budget
            is 90 %, 75 % or 50 % of device memory. ``None`` (the default): the
            eviction threshold (``MEMSCALE_EVICTION_THRESHOLD`` or
            ``install(threshold=...)``) when one is set, else ``"balanced"``.
        threshold: overrides ``mode``: bytes, ``"12GiB"`` or ``"60%"``.
        recompute: allow evicting by dropping a tensor and recomputing it.
        swap: allow evicting by copying a tensor to host memory.
        park: when a rebuild at a tight budget finds nothing to evict, park
            in host memory what it holds for later instead of failing (see
            :func:`memscale.dtr`).
        evictee_min_size: tensors smaller than this many bytes are never evicted.
        recomp_time_factor: weight of recompute time in the engine's score.
        recomp_memory_factor: weight of memory in the engine's score.
        heuristic: engine heuristic name (one of :func:`heuristics`); ``None``:
            ``MEMSCALE_HEURISTIC`` when set, else the engine tunes (the first
            budgeted step records the program with the default heuristic,
            the engine chooses the configuration of later steps by replaying
            it; see :func:`memscale.dtr`).
        log_summary: log the per-run summary (evictions, rematerializations,
            overhead) when a wrapped run ends and from the Trainer callback.
        device_memory: the "device memory" percentages are taken of. ``None``:
            the GPU's total memory, or on CPU the peak of an unbudgeted
            baseline step.
        offload_limit: with ``swap`` or ``park``, the most bytes swapped out to host memory
            at any time (``None``: no cap); see :func:`memscale.dtr`.
        warmup_steps: the first steps run unbudgeted (recorded, nothing evicted).
        log_file: also write memscale's log (the summaries) to this file.
        observability_port: serve Prometheus metrics (evictions,
            rematerializations, usage, budget, overhead) on this port
            (:mod:`memscale.metrics`; needs ``prometheus_client``; 0 picks a
            free port).
        untracked_steps: let a step whose shapes already fitted the budget
            twice, tracked, run untracked as plain PyTorch (no per-op cost;
            :mod:`memscale._dropin.fitting`). ``None`` (the default):
            ``MEMSCALE_UNTRACKED_STEPS`` (``1``, the default, or ``0``).
        unit: what DTR tracks. ``None`` (the default): ``MEMSCALE_UNIT``
            (``op``, the default, or ``block``), so a script run unchanged can
            choose it. ``"op"``: every ATen op, in a
            region per step (any model, any tensor). ``"block"``: every call
            of the model's repeated blocks (:func:`memscale.blocks`: no per-op
            cost; whole blocks' activations evicted and recomputed), through
            ``wrap(module)``, ``enable()`` and ``memscale run --unit block``. Its budget: on a GPU ``threshold`` or the mode's fraction of
            the device's memory, bounding the allocated bytes; on the CPU bytes
            of block activations, a percentage (or the mode's fraction) of what
            the first step's blocks held. ``"auto"``: ``"block"`` for a model
            that has repeated blocks (:func:`memscale._blocks.find_blocks`),
            ``"op"`` for one that has none (``optimize()`` and Lightning: op).

    memscale 0.1 names, accepted and mapped onto the fields above:
    ``enable_checkpointing`` (``recompute``), ``enable_offloading`` (``swap``),
    ``max_cpu_offload_gb`` (``offload_limit`` in GiB), ``target_gpu_utilization``
    (a fraction of device memory: ``threshold``); ``mode`` also takes an
    :class:`OptimizationMode`.
    """

    mode: Mode | OptimizationMode | None = None
    threshold: SizeLike | None = None
    recompute: bool = True
    swap: bool = False
    park: bool = True
    evictee_min_size: SizeLike | None = None
    recomp_time_factor: float | None = None
    recomp_memory_factor: float | None = None
    heuristic: str | None = None
    log_summary: bool = True
    device_memory: SizeLike | None = None
    offload_limit: SizeLike | None = None
    warmup_steps: int = 0
    log_file: str | os.PathLike[str] | None = None
    observability_port: int | None = None
    enable_checkpointing: bool | None = None
    enable_offloading: bool | None = None
    max_cpu_offload_gb: float | None = None
    target_gpu_utilization: float | None = None
    untracked_steps: bool | None = None
    unit: str | None = None

    def __post_init__(self) -> None:
        self._map_v01_names()
        if self.unit is None:
            object.__setattr__(self, "unit", unit_from_env())
            source = f" ({UNIT_ENV}={self.unit})"
        else:
            source = ""
        if self.unit not in UNITS:
            raise ConfigError(
                f"Config.unit={self.unit!r}: expected 'op' (the region), 'block' (memscale.blocks) or 'auto' "
                "(block where the model has repeated blocks, else op)"
            )
        if self.unit != "op" and self.swap:
            raise ConfigError(
                f"Config(unit={self.unit!r}, swap=True){source}: blocks are evicted by dropping and recomputing "
                "only; pass unit='op' for swapping"
            )
        if self.mode is not None and self.mode not in MODE_FRACTIONS:
            raise ConfigError(
                f"Config.mode={self.mode!r}: expected one of {', '.join(repr(m) for m in MODE_FRACTIONS)}"
            )
        for flag in ("recompute", "swap", "park", "log_summary"):
            if not isinstance(getattr(self, flag), bool):
                raise ConfigError(f"Config.{flag}={getattr(self, flag)!r}: expected True or False")
        if self.untracked_steps is not None and not isinstance(self.untracked_steps, bool):
            raise ConfigError(
                f"Config.untracked_steps={self.untracked_steps!r}: expected True, False or None "
                "(None: MEMSCALE_UNTRACKED_STEPS)"
            )
        if not self.recompute and not self.swap:
            raise ConfigError(
                "Config.recompute=False and Config.swap=False: nothing could ever be evicted; enable at least one"
            )
        if self.threshold is not None:
            # Validate the syntax now; a percentage is resolved in budget_for().
            nbytes = parse_size(self.threshold, name="Config.threshold", total=1)
            if nbytes == 0 and not is_percentage(self.threshold):
                raise ConfigError(f"Config.threshold={self.threshold!r}: must be positive")
        for field_name in ("evictee_min_size", "device_memory"):
            value = getattr(self, field_name)
            if value is not None:
                parse_size(value, name=f"Config.{field_name}", allow_percent=False)
        if self.device_memory is not None and self.device_bytes() == 0:
            raise ConfigError(f"Config.device_memory={self.device_memory!r}: must be positive")
        for field_name in ("recomp_time_factor", "recomp_memory_factor"):
            value = getattr(self, field_name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"Config.{field_name}={value!r}: expected a number >= 0")
            if not math.isfinite(value) or not 0 <= value <= MAX_RECOMP_FACTOR:
                raise ConfigError(
                    f"Config.{field_name}={value!r}: expected a number from 0 to {MAX_RECOMP_FACTOR} (the "
                    "engine's limit: larger exponents overflow the eviction score)"
                )
        check_heuristic(self.heuristic, "Config.heuristic")
        if self.offload_limit is not None:
            parse_size(self.offload_limit, name="Config.offload_limit", allow_percent=False)
        if isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise ConfigError(f"Config.warmup_steps={self.warmup_steps!r}: expected an integer >= 0")
        if self.log_file is not None and not isinstance(self.log_file, (str, os.PathLike)):
            raise ConfigError(f"Config.log_file={self.log_file!r}: expected a path")
        port = self.observability_port
        if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535):
            raise ConfigError(f"Config.observability_port={port!r}: expected a TCP port 0..65535 (0: any free port)")

    def _map_v01_names(self) -> None:
        """memscale 0.1's names onto this Config's fields (frozen: set once here)."""

        def put(name: str, value: object) -> None:
            object.__setattr__(self, name, value)

        if isinstance(self.mode, OptimizationMode):
            put("mode", self.mode.value)
        for old, new in (("enable_checkpointing", "recompute"), ("enable_offloading", "swap")):
            value = getattr(self, old)
            if value is not None:
                if not isinstance(value, bool):
                    raise ConfigError(f"Config.{old}={value!r}: expected True or False")
                put(new, value)
        gb = self.max_cpu_offload_gb
        if gb is not None:
            if isinstance(gb, bool) or not isinstance(gb, (int, float)) or not math.isfinite(gb) or gb < 0:
                raise ConfigError(f"Config.max_cpu_offload_gb={gb!r}: expected a number of GiB >= 0")
            if self.offload_limit is not None:
                raise ConfigError("Config.max_cpu_offload_gb and Config.offload_limit name the same cap; give one")
            put("offload_limit", int(gb * GB))
        target = self.target_gpu_utilization
        if target is not None:
            if isinstance(target, bool) or not isinstance(target, (int, float)) or not 0 < target <= 1:
                raise ConfigError(
                    f"Config.target_gpu_utilization={target!r}: expected a fraction of device memory in (0, 1]"
                )
            if self.threshold is not None:
                raise ConfigError("Config.target_gpu_utilization and Config.threshold name the same budget; give one")
            put("threshold", f"{target * 100:g}%")

    @property
    def fraction(self) -> float:
        """The mode's fraction of device memory (0.9, 0.75 or 0.5; ``None``
        counts as :data:`DEFAULT_MODE`)."""
        return MODE_FRACTIONS[self.mode or DEFAULT_MODE]

    def describe_budget(self, device_bytes: int, of: str = "device memory") -> str:
        """Where :meth:`budget_for` takes its bytes from, for summaries."""
        if self.threshold is not None:
            return f"Config.threshold={self.threshold!r}"
        mode = repr(self.mode) if self.mode is not None else f"{DEFAULT_MODE!r} (default)"
        return f"Config.mode={mode}: {self.fraction:.0%} of {of} ({format_bytes(device_bytes)})"

    def device_bytes(self) -> int | None:
        """``device_memory`` in bytes, or ``None`` when not given."""
        if self.device_memory is None:
            return None
        return parse_size(self.device_memory, name="Config.device_memory", allow_percent=False)

    def budget_for(self, device_bytes: int) -> int:
        """The budget in bytes for a device of ``device_bytes`` memory.

        ``threshold`` wins when set (a percentage is taken of ``device_bytes``);
        otherwise the mode's fraction of ``device_bytes``.

        Raises:
            ConfigError: ``device_bytes`` is not a positive integer.
        """
        if isinstance(device_bytes, bool) or not isinstance(device_bytes, int) or device_bytes <= 0:
            raise ConfigError(f"device_bytes={device_bytes!r}: expected a positive number of bytes")
        if self.threshold is not None:
            return parse_size(self.threshold, name="Config.threshold", total=device_bytes)
        return max(1, int(device_bytes * self.fraction))

    def region_kwargs(self) -> dict[str, object]:
        """Keyword arguments for :func:`memscale.dtr` (everything but the budget)."""
        kwargs: dict[str, object] = {"recompute": self.recompute, "swap": self.swap, "park": self.park}
        if self.heuristic is not None:
            kwargs["heuristic"] = self.heuristic
        if self.evictee_min_size is not None:
            kwargs["evictee_min_size"] = parse_size(
                self.evictee_min_size, name="Config.evictee_min_size", allow_percent=False
            )
        if self.recomp_time_factor is not None:
            kwargs["recomp_time_factor"] = float(self.recomp_time_factor)
        if self.recomp_memory_factor is not None:
            kwargs["recomp_memory_factor"] = float(self.recomp_memory_factor)
        if self.offload_limit is not None:
            kwargs["offload_limit"] = parse_size(self.offload_limit, name="Config.offload_limit", allow_percent=False)
        return kwargs

    def as_dict(self) -> dict[str, object]:
        """The settings as a plain dict (for logging)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}
