"""``memscale.plan``: will this training step fit on that GPU, and at what cost.

:func:`plan` records one training step (forward, backward; the optimizer's
state and step from a copy on ``meta``) as a DTR trace - on the ``meta``
device when asked, so a step far larger than this machine's memory is
recorded without allocating it, its op costs estimated by a cost model
(:mod:`memscale._plan.costs`) - and hands it to ``memscale plan`` (the Go
half, ``internal/planner``), which reports the peak with no eviction, a
static placement of every storage (its arena against the peak is the
fragmentation floor), the least budget DTR runs the step in, DTR's overhead
against the budget (engine replays) with ``violates_<budget>`` flags, an
active budget and the Pareto frontier, the devices checked and the largest
batch each fits, and a recommendation in words. The same report as ``memscale
plan TRACE`` on the command line.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..errors import MemscaleError

__all__ = ["Plan", "plan"]


class Plan:
    """A plan: ``report`` (the JSON of ``memscale plan``: ``plans``, one per
    batch size, and ``batches``), ``text`` (what the command prints),
    ``summary`` (the first plan's recommendation in words) and the files
    written (``traces``, ``json_path``, ``plot_path``)."""

    def __init__(self, report: dict[str, Any], text: str, traces: list[Path], json_path: Path, plot_path: Path | None) -> None:
        self.report = report
        self.text = text
        self.traces = traces
        self.json_path = json_path
        self.plot_path = plot_path

    @property
    def plans(self) -> list[dict[str, Any]]:
        return list(self.report["plans"])

    @property
    def summary(self) -> str:
        return " ".join(p["summary"] for p in self.report["plans"])

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"<memscale.Plan: {self.summary[:120]}...>"


def _native() -> Path:
    from .._cli import native_command

    path = native_command()
    if path is None:
        raise MemscaleError(
            "memscale.plan: the native memscale command was not found next to the package or in a checkout's "
            "build/: reinstall with pip install ./pytorch_plugin, or run make cli"
        )
    return path


def _sizes(name: str, values: Sequence[str | int] | str | None) -> str:
    """A comma list for the command line (sizes are checked there)."""
    if values is None:
        return ""
    if isinstance(values, str):
        return values
    return ",".join(str(v) for v in values)


def plan(
    model: Any,
    sample_batch: Any,
    optimizer: Any = None,
    loss_fn: Callable[..., Any] | None = None,
    device: str | None = None,
    *,
    budgets: Sequence[str | int] | str | None = None,
    active: str | int | None = None,
    target: Sequence[str] | str | None = None,
    batch_sizes: Sequence[int] | None = None,
    cost_device: str | None = None,
    ratios: str | None = None,
    max_overhead: float | None = None,
    overhead_limit: float | None = None,
    heuristic: str = "default",
    repeats: int = 1,
    out: str | os.PathLike[str] | None = None,
    plot: bool = True,
) -> Plan:
    """Plan one training step of ``model`` on ``sample_batch``.

    Args:
        model: the model (on ``device="meta"`` a meta copy is recorded, or the
            model itself when it is on ``meta`` already).
        sample_batch: one batch: a tensor, a mapping (``model(**batch)``) or a
            sequence (``model(*batch)``; with ``loss_fn`` an ``(inputs,
            target)`` pair: ``loss_fn(model(inputs), target)``).
        optimizer: the optimizer; its state and step peak are counted from a
            copy of it stepping meta copies of the parameters.
        loss_fn: the loss; default: the output's ``.loss``, or the output.
        device: ``"meta"`` (record without allocating; op costs estimated for
            ``cost_device``) or ``None`` (the model's own device, measured).
        budgets: memory budgets to track (``["24GiB", "40GiB"]``).
        active: the active budget, which accepts or rejects each variant.
        target: devices to check (``"h100"``, ``["l4", "h100"]``, ``"all"``).
        batch_sizes: plan the batch at each of these sizes (rows repeated or
            cut) and find the largest each device fits.
        cost_device: the device the cost model estimates for (default: the
            first ``target``, else ``h100``).
        ratios: DTR budgets of the frontier as ratios of the peak
            (``"0.1..0.9"``).
        max_overhead: what the active budget and the balanced profile accept.
        overhead_limit: abandon a replay past this overhead (default 2;
            ``math.inf``: never, as the region, which runs its first step to
            the end or to a budget it cannot keep).
        heuristic: the engine's policy for the replays: ``"default"`` (its
            default heuristic: fast, an upper bound of the tuned overhead) or
            ``"auto"`` (what ``memscale.dtr(budget)`` runs: a first step with
            the default heuristic, recorded and tuned by the engine, 52 replays
            per budget, and the steps after it with the chosen configuration,
            which is what is reported). Every replay runs the region's engine
            configuration, rebuilds and pinned gradients.
        repeats: with measured costs (``device=None``), run the step this many
            times and take each op's median time (op times vary from step to
            step; the median of a few is a steadier prediction).
        out: a directory for the traces, the JSON and the plot (default: a
            temporary one).
        plot: write a PNG of budget against overhead, devices marked.

    Returns:
        the :class:`Plan`.

    Raises:
        MemscaleError: a bad argument (one line, naming what would work), a
            step that does not run, or the native command's error.
    """
    from .record import batch_size, record_step, resize_batch

    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise MemscaleError(f"memscale.plan(repeats={repeats!r}): want a whole number >= 1")

    targets = [target] if isinstance(target, str) else list(target or [])
    cost = cost_device or next((t for t in targets if t != "all"), "h100")
    from .costs import lookup_device

    lookup_device(cost)  # a bad name fails before anything runs
    for t in targets:
        if t != "all":
            lookup_device(t)
    outdir = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="memscale-plan-"))
    outdir.mkdir(parents=True, exist_ok=True)
    sizes = list(batch_sizes) if batch_sizes else [batch_size(sample_batch)]
    traces = []
    for n in sizes:
        b = resize_batch(sample_batch, n) if batch_sizes else sample_batch
        path = outdir / f"step-b{n}.log.gz"
        record_step(model, b, path, optimizer=optimizer, loss_fn=loss_fn, device=device, cost_device=cost, repeats=repeats)
        traces.append(path)
    json_path = outdir / "plan.json"
    args = [str(_native()), "plan", *map(str, traces), "--json", str(json_path)]
    if budgets:
        args += ["--budgets", _sizes("budgets", budgets)]
    if active is not None:
        args += ["--active", str(active)]
    if targets:
        args += ["--device", ",".join(targets)]
    if batch_sizes:
        args += ["--batch-sizes", ",".join(map(str, sizes))]
    if ratios:
        args += ["--ratios", ratios]
    args += ["--heuristic", heuristic]
    if max_overhead is not None:
        args += ["--max-overhead", str(max_overhead)]
    if overhead_limit is not None:
        args += ["--overhead-limit", "inf" if overhead_limit == float("inf") else str(overhead_limit)]
    plot_path = outdir / "plan.png" if plot else None
    if plot_path is not None:
        args += ["--plot", str(plot_path)]
    proc = subprocess.run(args, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise MemscaleError(proc.stderr.strip().removeprefix("memscale: error: ") or f"memscale plan failed ({proc.returncode})")
    report = json.loads(json_path.read_text())
    return Plan(report, proc.stdout, traces, json_path, plot_path)
