"""The counters a DTR region reports, shared by the region and the drop-in API.

One place for the names of the engine's counters that add up over regions, for
the compute-overhead formula and for :class:`Summary` (the drop-in API's
totals), so :meth:`memscale.DTRRegion.summary` and :class:`memscale.Summary`
can never disagree. Holds no state.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Final

from .config import format_bytes

#: Engine counters (keys of ``memscale_dtr_stats_json``) that add up over the
#: entries of a region and over regions.
SUMMED_KEYS: Final[tuple[str, ...]] = (
    "evictions",
    "rematerializations",
    "swaps_out",
    "swaps_in",
    "parked",
    "bytes_evicted",
    "base_cost_ns",
    "remat_cost_ns",
)


#: Summary keys of the allocator's counters, summed over regions: its 2 MiB
#: granules mapped, unmapped and remapped, and the large requests its step
#: plans placed or missed (:mod:`memscale._allocator.boundary`).
GRANULE_KEYS: Final[tuple[str, ...]] = (
    "granules_mapped",
    "granules_unmapped",
    "granules_remapped",
    "step_plan_placed",
    "step_plan_missed",
)


def overhead(base_cost_ns: int, remat_cost_ns: int) -> float:
    """Compute overhead ``(base + remat) / base``: 1.0 when nothing was recomputed
    (or nothing ran)."""
    return (base_cost_ns + remat_cost_ns) / base_cost_ns if base_cost_ns > 0 else 1.0


@dataclass
class Summary:
    """What memscale did over the wrapped run.

    Attributes:
        steps: training steps completed, tracked under a region (the
            baseline step included) or untracked (``untracked_steps``).
        evictions / rematerializations / swaps_out / swaps_in: engine counts.
        parked: swaps out (counted in ``swaps_out``) that parked, in host
            memory, what a rebuild's outer levels hold or what an open plan
            reads later, because a tight budget had nothing else to take.
        bytes_evicted: bytes freed by evictions (drop or swap), in total.
        base_cost_ns: measured run time of the ops the engine recorded.
        remat_cost_ns: measured time spent recomputing evicted tensors;
            :attr:`overhead` is ``(base + remat) / base``.
        peak_usage: highest usage seen by a budgeted region, in bytes.
        budget: the budget of the latest region (``None``: unbudgeted).
        baseline_peak: peak usage of the unbudgeted baseline step, when one ran.
        budget_source: where the latest region's budget came from
            (``MEMSCALE_EVICTION_THRESHOLD=...``, ``Config.mode=...``...).
        tuning: the latest region's ``summary()["tuning"]``: ``None`` until the
            engine tuned a budgeted region (an explicit heuristic never tunes),
            else its choice, ``overhead``, ``default_overhead``, ``wall_ns``,
            ``instructions`` and ``config``, or ``{"error": message}``.
        untracked_steps: steps (counted in ``steps``) that ran untracked,
            as plain PyTorch, because steps of the same shapes had fitted the
            budget (:mod:`memscale._dropin.fitting`).
        untracked_over_budget: untracked steps whose measured peak (GPU,
            memscale allocator) went over the budget; their shapes are
            tracked from then on.
        granules_mapped / granules_unmapped / granules_remapped: what the
            memscale allocator did to its 2 MiB granules during the tracked
            steps (GPU, memscale allocator; 0 otherwise): a remap unmaps a
            free granule and maps it where a request needed it.
        step_plan_placed / step_plan_missed: large requests of those steps
            that the allocator's step plans placed / that fell back to best
            fit (memscale tells the allocator where each step ends; plans
            need a budget; 0 without the memscale allocator).
        min_budget: the highest of the regions' ``min_budget`` (bytes): a lower
            bound below which no budget can run these steps (0: not measured).
        least_threshold: under :func:`memscale.enable`, the least threshold
            found to run every step shape measured (bytes: replays of each
            shape's first step, searched upward from its floor; 0: none
            searched) - the one to set, where ``min_budget`` is a bound.
        untracked_promoted: steps that began untracked and met a forward the
            fits of their shapes did not have (gradient accumulation over
            another micro-batch shape): tracked from that forward on; not in
            ``untracked_steps``.
        unit_steps: with ``unit="auto"`` under :func:`memscale.enable`, the
            unit ``auto`` chose for the steps: ``{"block": n, "op": m}``, the
            steps run by block-level DTR (a model with blocks opened them;
            its loss module ran in them) and by a region per step (``None``:
            not ``auto``).
    """

    steps: int = 0
    evictions: int = 0
    rematerializations: int = 0
    swaps_out: int = 0
    swaps_in: int = 0
    parked: int = 0
    bytes_evicted: int = 0
    base_cost_ns: int = 0
    remat_cost_ns: int = 0
    peak_usage: int = 0
    budget: int | None = None
    baseline_peak: int | None = None
    tuning: dict[str, Any] | None = None
    budget_source: str | None = None
    untracked_steps: int = 0
    untracked_over_budget: int = 0
    untracked_promoted: int = 0
    min_budget: int = 0
    least_threshold: int = 0
    granules_mapped: int = 0
    granules_unmapped: int = 0
    granules_remapped: int = 0
    step_plan_placed: int = 0
    step_plan_missed: int = 0
    unit_steps: dict[str, int] | None = None

    def merged(self, other: Summary) -> Summary:
        """The totals of two runs side by side (``Config(unit="auto")``'s
        regions and blocks, or several models' blocks): counters added, the
        higher peak, this one's budget and tuning where it has them."""
        added = {
            name: getattr(self, name) + getattr(other, name)
            for name in (
                "steps", "evictions", "rematerializations", "swaps_out", "swaps_in", "parked", "bytes_evicted",
                "base_cost_ns", "remat_cost_ns", "untracked_steps", "untracked_over_budget", "untracked_promoted",
                *GRANULE_KEYS,
            )
        }
        return Summary(
            **added,
            peak_usage=max(self.peak_usage, other.peak_usage),
            min_budget=max(self.min_budget, other.min_budget),
            least_threshold=max(self.least_threshold, other.least_threshold),
            budget=self.budget if self.budget is not None else other.budget,
            tuning=self.tuning if self.tuning is not None else other.tuning,
            budget_source=self.budget_source or other.budget_source,
            unit_steps=self.unit_steps if self.unit_steps is not None else other.unit_steps,
        )

    @property
    def overhead(self) -> float:
        """``(base + remat) / base`` compute time, as ``DTRRegion.summary()`` defines it (1.0: none)."""
        return overhead(self.base_cost_ns, self.remat_cost_ns)

    @property
    def bytes_saved(self) -> int | None:
        """``baseline_peak - peak_usage`` when a baseline step was measured and
        a budgeted step ran after it (``None`` otherwise)."""
        if self.baseline_peak is None or self.peak_usage <= 0:
            return None
        return self.baseline_peak - self.peak_usage

    def as_dict(self) -> dict[str, Any]:
        """All fields plus ``overhead`` and ``bytes_saved``."""
        out = asdict(self)
        out["overhead"] = self.overhead
        out["bytes_saved"] = self.bytes_saved
        return out

    def _untracked_text(self) -> str:
        if not self.untracked_steps and not self.untracked_promoted:
            return ""
        over = f", {self.untracked_over_budget} over budget" if self.untracked_over_budget else ""
        if self.untracked_promoted:
            over += f", {self.untracked_promoted} more tracked from a forward their shapes had not had"
        return f" ({self.untracked_steps} untracked: they fitted the budget{over})"

    def _unit_text(self) -> str:
        if self.unit_steps is None:
            return ""
        blocks, regions = self.unit_steps.get("block", 0), self.unit_steps.get("op", 0)
        return f" (unit auto: {blocks} by block-level DTR, {regions} by a region per step)"

    def __str__(self) -> str:
        budget = "unbudgeted" if self.budget is None else f"budget {format_bytes(self.budget)}"
        if self.budget_source:
            budget += f" from {self.budget_source}"
        text = (
            f"{self.steps} steps{self._untracked_text()}{self._unit_text()}, {budget}, peak {format_bytes(self.peak_usage)}, "
            f"{self.evictions} evictions ({format_bytes(self.bytes_evicted)}), "
            f"{self.rematerializations} rematerializations, {self.swaps_out} swaps out / "
            f"{self.swaps_in} in{f' ({self.parked} parked)' if self.parked else ''}, "
            f"compute overhead x{self.overhead:.3f}"
        )
        planned = self.step_plan_placed + self.step_plan_missed
        if self.granules_mapped or self.granules_remapped or planned:
            per_step = f" ({self.granules_remapped / self.steps:.1f} per step)" if self.steps else ""
            text += (
                f", allocator: {self.granules_mapped} granules mapped, {self.granules_unmapped} unmapped, "
                f"{self.granules_remapped} remapped{per_step}"
            )
            if planned:
                text += f", step plans placed {self.step_plan_placed} of {planned} large requests"
        if self.bytes_saved is not None:
            text += f", saved {format_bytes(self.bytes_saved)} vs baseline peak {format_bytes(self.baseline_peak or 0)}"
        if self.tuning is not None:
            text += f", tuned: {self.tuning.get('choice') or 'failed: ' + str(self.tuning.get('error'))}"
        return text
