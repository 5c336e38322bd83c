"""Op costs without running the ops: FLOPs and bytes moved against a GPU's
peak rates (a roofline), for steps recorded on the ``meta`` device.

Every number here is an **estimate**: an op takes ``max(FLOPs / (peak x
compute efficiency), bytes / (bandwidth x memory efficiency))`` plus a launch
cost. FLOPs come from :mod:`torch.utils.flop_counter`'s formulas (matmuls,
convolutions, attention; other ops count 0 FLOPs and are bound by their
bytes); bytes moved are the op's tensor inputs read and its fresh outputs
written. The device table is the one ``memscale plan --list-devices`` prints
(``internal/planner/devices.go``; a test keeps the two equal).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

from ..errors import MemscaleError

__all__ = ["DEVICES", "CostModel", "CostMode", "GPU", "lookup_device"]


@dataclass(frozen=True)
class GPU:
    """A GPU of the table: memory in bytes, peak rates."""

    key: str
    name: str
    memory_bytes: int
    bf16_flops: float
    fp32_flops: float
    bandwidth_bytes_per_s: float


_MIB: Final = 1 << 20

#: The device table (SXM parts, dense rates, no sparsity; memory as CUDA reports
#: it where a GPU run measured it - H100, H200 - else as nvidia-smi does).
DEVICES: Final[dict[str, GPU]] = {
    g.key: g
    for g in (
        GPU("h100", "H100 80GB", 81080 * _MIB, 989e12, 67e12, 3.35e12),
        GPU("h200", "H200 141GB", 143155 * _MIB, 989e12, 67e12, 4.8e12),
        GPU("a100-40gb", "A100 40GB", 40960 * _MIB, 312e12, 19.5e12, 1.555e12),
        GPU("a100-80gb", "A100 80GB", 81920 * _MIB, 312e12, 19.5e12, 2.039e12),
        GPU("l4", "L4 24GB", 23034 * _MIB, 121e12, 30.3e12, 300e9),
        GPU("rtx4090", "RTX 4090 24GB", 24564 * _MIB, 165e12, 82.6e12, 1.008e12),
    )
}
_ALIASES: Final = {"a100": "a100-80gb", "a100-40": "a100-40gb", "a100-80": "a100-80gb", "4090": "rtx4090", "rtx-4090": "rtx4090"}


def lookup_device(name: str) -> GPU:
    """The table's device named ``name`` (a key or an alias, any case)."""
    key = _ALIASES.get(name.strip().lower(), name.strip().lower())
    if key not in DEVICES:
        raise MemscaleError(f"unknown device {name!r} (known: {', '.join(sorted(DEVICES))})")
    return DEVICES[key]


#: Fractions of the peak rates a real kernel reaches (large GEMMs ~70 %,
#: streaming kernels ~80 % of the bandwidth) and a kernel's launch cost.
COMPUTE_EFFICIENCY: Final = 0.7
MEMORY_EFFICIENCY: Final = 0.8
LAUNCH_NS: Final = 2000
#: What a view (no kernel: metadata only) costs.
VIEW_NS: Final = 10

_HALF: Final = (torch.float16, torch.bfloat16)


class CostModel:
    """Estimated op times on ``gpu``."""

    def __init__(self, gpu: GPU) -> None:
        self.gpu = gpu

    @property
    def label(self) -> str:
        return (
            f"estimated for {self.gpu.name} (FLOPs from torch.utils.flop_counter and bytes moved against "
            f"{COMPUTE_EFFICIENCY:.0%} of its peak compute and {MEMORY_EFFICIENCY:.0%} of its bandwidth, "
            f"+{LAUNCH_NS / 1000:g} us a kernel)"
        )

    def op_ns(self, func: Any, args: Any, kwargs: Any, out: Any) -> int:
        """The estimated time of one op in nanoseconds."""
        flops = 0
        packet = func._overloadpacket
        if packet in flop_registry:
            try:
                flops = int(flop_registry[packet](*args, **(kwargs or {}), out_val=out))
            except Exception:  # a formula that does not fit this overload: bytes only
                flops = 0
        ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        outs = _outputs(func, out)
        moved = sum(_nbytes(t) for t in ins)
        # A fresh output is written; an alias of an input (a view, or what an
        # in-place or out= op returns) is not - unless the op writes it.
        written = [t for t, alias in outs if not alias or func._schema.is_mutable]
        if not written and not flops and outs:
            return VIEW_NS  # a view or metadata change: no kernel
        moved += sum(_nbytes(t) for t in written)
        ins_outs = ins + [t for t, _ in outs]
        half = any(t.dtype in _HALF for t in ins_outs)
        peak = self.gpu.bf16_flops if half else self.gpu.fp32_flops
        t = max(flops / (peak * COMPUTE_EFFICIENCY), moved / (self.gpu.bandwidth_bytes_per_s * MEMORY_EFFICIENCY))
        return int(t * 1e9) + LAUNCH_NS


#: Ops that return a view of their input without saying so in their schema.
_UNANNOTATED_VIEWS: Final = frozenset({torch.ops.aten._unsafe_view})


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _outputs(func: Any, out: Any) -> list[tuple[torch.Tensor, bool]]:
    """Each output tensor of ``func`` with whether it aliases an input, from
    the op's schema (``Tensor(a)`` returns: views, in-place and out= ops). At
    the dispatch level a view's ``_base`` is not set yet, and the region's
    tensors are wrappers, so the schema is what tells."""
    rets = func._schema.returns
    view = func._overloadpacket in _UNANNOTATED_VIEWS
    per = out if len(rets) > 1 and isinstance(out, (tuple, list)) else (out,)
    pairs = []
    for r, o in zip(rets, per):
        alias = view or r.alias_info is not None
        pairs += [(t, alias) for t in tree_flatten(o)[0] if isinstance(t, torch.Tensor)]
    return pairs


class CostMode(TorchDispatchMode):
    """Sets the estimated cost of every op on the trace records its op
    added (entered inside the recording region, so it sees each op first)."""

    def __init__(self, model: CostModel, records: list[dict[str, Any]]) -> None:
        super().__init__()
        self.model = model
        self.records = records

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        n = len(self.records)
        out = func(*args, **(kwargs or {}))
        if len(self.records) > n:
            cost = str(self.model.op_ns(func, args, kwargs, out))
            for rec in self.records[n:]:
                if "TIME" in rec:
                    rec["TIME"] = cost
        return out
