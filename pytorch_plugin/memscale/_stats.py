"""The counters a DTR region reports, shared by the region and the drop-in API.

One place for the names of the engine's counters that add up over regions and
for the compute-overhead formula, so :meth:`memscale.DTRRegion.summary` and
:class:`memscale.Summary` can never disagree. Holds no state.
"""

from __future__ import annotations

from typing import Final

#: Engine counters (keys of ``memscale_dtr_stats_json``) that add up over the
#: entries of a region and over regions.
SUMMED_KEYS: Final[tuple[str, ...]] = (
    "evictions",
    "rematerializations",
    "swaps_out",
    "swaps_in",
    "bytes_evicted",
    "base_cost_ns",
    "remat_cost_ns",
)


def overhead(base_cost_ns: int, remat_cost_ns: int) -> float:
    """Compute overhead ``(base + remat) / base``: 1.0 when nothing was recomputed
    (or nothing ran)."""
    return (base_cost_ns + remat_cost_ns) / base_cost_ns if base_cost_ns > 0 else 1.0
