"""Recording one training step for the planner: the forward and backward as
a DTR trace (memscale.trace's recorder, with op costs from the cost model on
``meta``), and what the trace does not see - parameters, gradients, the
optimizer's state and the peak of its step - as the plan's model information.
"""

from __future__ import annotations

import copy
import gzip
import io
import json
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from ..errors import MemscaleError
from .._region import DTRRegion
from ..trace import _dumps, _Sink
from .costs import CostMode, CostModel

__all__ = ["StepRecording", "record_step", "resize_batch"]


class _BufferedSink(_Sink):
    """memscale.trace's sink, keeping the records so their costs can be set
    after the op returned; written out at the end. It also notes the tensors
    the region pins (a parameter's accumulated gradient): the trace format
    has no line for a pin, and a replay that may evict a gradient the region
    keeps predicts another step (:func:`pins`)."""

    def __init__(self) -> None:
        super().__init__(io.StringIO())
        self.records: list[dict[str, Any]] = []
        #: (records written before the pin, the pinned reference's name)
        self.pinned: list[tuple[int, str]] = []

    def _w(self, obj: dict[str, Any]) -> None:
        self.records.append(obj)
        self.lines += 1

    def start(self, entry: Any) -> None:
        super().start(entry)
        engine = entry.engine
        pin = engine.pin

        def noted(t: int) -> None:
            name = self.names.get(t)
            if name is not None:
                self.pinned.append((len(self.records), name))
            pin(t)

        engine.pin = noted


def median_costs(runs: list[list[dict[str, Any]]]) -> None:
    """Set each op's ``TIME`` in ``runs[0]`` to its median over the recordings
    ``runs`` of the same step; recordings whose program differs from the first
    (another op, name or argument anywhere) are left out."""
    def shape(rec: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in rec.items() if k != "TIME"}

    first = runs[0]
    same = [r for r in runs[1:] if len(r) == len(first) and all(shape(a) == shape(b) for a, b in zip(first, r))]
    if not same:
        return
    for i, rec in enumerate(first):
        if "TIME" in rec:
            times = sorted(int(r[i]["TIME"]) for r in (first, *same))
            n = len(times)
            rec["TIME"] = str(times[n // 2] if n % 2 else (times[n // 2 - 1] + times[n // 2]) // 2)


def pins(records: list[dict[str, Any]], pinned: list[tuple[int, str]]) -> list[dict[str, int]]:
    """The pins of ``pinned`` as the planner reads them (``ModelInfo.Pins``):
    after line ``after_line`` of the trace (1-based), the tensor made by line
    ``line`` - output ``out`` of a CALL (its RESULT index) or of a MUTATE (the
    index into its MUTATE list), 0 for a COPY or CONSTANT - is pinned. The
    name's latest definition before the pin is the tensor it names then."""
    out: list[dict[str, int]] = []
    made: dict[str, tuple[int, int]] = {}
    todo = sorted(pinned)
    k = 0
    for i, rec in enumerate(records):
        while k < len(todo) and todo[k][0] <= i:
            at, name = todo[k]
            if name in made:
                out.append({"after_line": at, "line": made[name][0], "out": made[name][1]})
            k += 1
        kind = rec.get("INSTRUCTION")
        if kind == "CALL":
            for j, n in enumerate(rec["RESULT"]):
                made[n] = (i + 1, j)
        elif kind == "MUTATE":
            for j, a in enumerate(rec["MUTATE"]):
                made[rec["ARGS"][a]] = (i + 1, j)
        elif kind == "COPY":
            made[rec["DST"]] = (i + 1, 0)
        elif kind == "CONSTANT":
            made[rec["NAME"]] = (i + 1, 0)
    for at, name in todo[k:]:
        if name in made:
            out.append({"after_line": at, "line": made[name][0], "out": made[name][1]})
    return out


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def resize_batch(batch: Any, n: int) -> Any:
    """``batch`` with every tensor's first dimension made ``n`` (rows repeated
    or cut): the same sample at another batch size."""

    def one(t: Any) -> Any:
        if not isinstance(t, torch.Tensor) or t.dim() == 0:
            return t
        b = t.shape[0]
        if b == n:
            return t
        reps = -(-n // b)
        return t.repeat(reps, *([1] * (t.dim() - 1)))[:n].contiguous()

    return tree_map(one, batch)


def batch_size(batch: Any) -> int:
    """The first dimension of the batch's first tensor (0: none)."""
    for t in tree_flatten(batch)[0]:
        if isinstance(t, torch.Tensor) and t.dim() > 0:
            return int(t.shape[0])
    return 0


def _forward_loss(model: Any, batch: Any, loss_fn: Callable[..., Any] | None) -> torch.Tensor:
    """The step's loss: ``loss_fn(model(inputs), target)`` for an ``(inputs,
    target)`` pair, ``loss_fn(model(**batch), batch)`` for a mapping; with no
    ``loss_fn`` the output's ``.loss``, or the output itself when a scalar,
    else its sum."""
    if loss_fn is not None and isinstance(batch, (tuple, list)) and len(batch) == 2:
        return loss_fn(model(batch[0]), batch[1])
    if isinstance(batch, dict):
        out = model(**batch)
    elif isinstance(batch, (tuple, list)):
        out = model(*batch)
    else:
        out = model(batch)
    if loss_fn is not None:
        return loss_fn(out, batch)
    loss = getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    if isinstance(out, torch.Tensor):
        return out if out.dim() == 0 else out.float().sum()
    raise MemscaleError(
        "memscale.plan: the model's output has no .loss and is not a tensor: pass loss_fn "
        "(called as loss_fn(model(inputs), target) for an (inputs, target) batch)"
    )


class _LiveBytes(TorchDispatchMode):
    """Counts the bytes of the fresh tensors ops make while they live (their
    Python objects): the transient peak of a piece of code."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0

    def _free(self, n: int) -> None:
        self.live -= n

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        ins = {id(t) for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and id(t) not in ins and t._base is None:
                n = _nbytes(t)
                self.live += n
                self.peak = max(self.peak, self.live)
                weakref.finalize(t, self._free, n)
        return out


def _optimizer_on_meta(optimizer: Any, params: list[torch.nn.Parameter]) -> tuple[int, int]:
    """The optimizer's state bytes after a step, and the step's peak
    (parameters, gradients, state and its temporaries), from a copy of it
    stepping meta copies of ``params``."""
    index = {id(p): i for i, p in enumerate(params)}
    metas = [torch.nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad) for p in params]
    groups = []
    for g in optimizer.param_groups:
        mg = {k: v for k, v in g.items() if k != "params"}
        mg["params"] = [metas[index[id(p)]] for p in g["params"] if id(p) in index]
        for k in ("foreach", "fused", "capturable"):
            if mg.get(k):
                mg[k] = False
        groups.append(mg)
    try:
        shadow = type(optimizer)(groups)
    except TypeError:  # a constructor that wants its learning rate given
        shadow = type(optimizer)(groups, lr=optimizer.defaults.get("lr", 1e-3))
    for m in metas:
        if m.requires_grad:
            m.grad = torch.empty_like(m)
    base = sum(_nbytes(m) for m in metas) + sum(_nbytes(m.grad) for m in metas if m.grad is not None)
    counter = _LiveBytes()
    with counter:
        shadow.step()
    state = 0
    for st in shadow.state.values():
        for v in st.values():
            if isinstance(v, torch.Tensor):
                state += _nbytes(v)
    # The state is made during the first step: counted in the transient peak.
    return state, base + max(counter.peak, state)


def _meta_copy(model: Any) -> Any:
    """A copy of ``model`` on ``meta`` with its shared parameters (tied
    embeddings) still shared: ``Module.to("meta")`` makes a new parameter per
    module, which unties them."""
    shared: dict[int, list[tuple[str, str]]] = {}
    for mod_name, mod in model.named_modules(remove_duplicate=False):
        for name, p in mod.named_parameters(recurse=False):
            shared.setdefault(id(p), []).append((mod_name, name))
    meta = copy.deepcopy(model).to("meta")
    for places in shared.values():
        first = meta.get_submodule(places[0][0])._parameters[places[0][1]]
        for mod_name, name in places[1:]:
            meta.get_submodule(mod_name)._parameters[name] = first
    return meta


class StepRecording:
    """One recorded step: the trace's path and the plan's model information."""

    def __init__(self, trace: Path, info: dict[str, Any]) -> None:
        self.trace = trace
        self.info = info


def record_step(
    model: Any,
    batch: Any,
    path: Path,
    *,
    optimizer: Any = None,
    loss_fn: Callable[..., Any] | None = None,
    device: str | None = None,
    cost_device: str = "h100",
    repeats: int = 1,
) -> StepRecording:
    """Record one training step of ``model`` on ``batch`` as a DTR trace at
    ``path`` (gzip) with the model information beside it (``path.info.json``).

    ``device="meta"`` records on meta copies (nothing is allocated; op costs are
    the cost model's estimates for ``cost_device``); ``None`` runs the step
    where the model is, with measured op costs: with ``repeats`` > 1 the step
    is run that many times and each op's cost is its median (measured op times
    vary from step to step, more on a shared machine; see
    :func:`median_costs`).
    """
    from .costs import lookup_device

    params = [p for p in model.parameters()]
    p_bytes = sum(_nbytes(p) for p in params)
    g_bytes = sum(_nbytes(p) for p in params if p.requires_grad)
    on_meta = device == "meta"
    if on_meta:
        if any(p.device.type != "meta" for p in params):
            model = _meta_copy(model)
        batch = tree_map(lambda t: t.to("meta") if isinstance(t, torch.Tensor) else t, batch)
    elif device is not None:
        raise MemscaleError(f"memscale.plan: device={device!r}: want 'meta' or None (the model's own device)")
    was_training = model.training
    model.train()
    # One step first, so that lazy initialisation is not in the trace.
    try:
        _forward_loss(model, batch, loss_fn).backward()
    except (RuntimeError, NotImplementedError) as exc:
        if on_meta and "meta" in str(exc):
            raise MemscaleError(
                f"memscale.plan: on meta, the step read a tensor's value ({str(exc).splitlines()[0][:160]}): a meta "
                "tensor has none. Hugging Face models do while building the attention mask: with no attention_mask "
                "and use_cache off (the packed-sequence check), or with one under sdpa attention (its all-ones "
                "check). Pass an attention_mask (torch.ones like input_ids) with attn_implementation='eager', or "
                "plan with device=None"
            ) from exc
        raise
    model.zero_grad(set_to_none=True)

    sink = _BufferedSink()
    costs = None
    with DTRRegion(None, sink=sink):
        if on_meta:
            costs = CostModel(lookup_device(cost_device))
            with CostMode(costs, sink.records):
                loss = _forward_loss(model, batch, loss_fn)
                loss.backward()
        else:
            loss = _forward_loss(model, batch, loss_fn)
            loss.backward()
    if not on_meta and repeats > 1:
        again: list[list[dict[str, Any]]] = [sink.records]
        for _ in range(repeats - 1):
            model.zero_grad(set_to_none=True)
            more = _BufferedSink()
            with DTRRegion(None, sink=more):
                _forward_loss(model, batch, loss_fn).backward()
            again.append(more.records)
        median_costs(again)
    model.zero_grad(set_to_none=True)
    model.train(was_training)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(_dumps(obj) + "\n" for obj in sink.records).encode()
    with open(path, "wb") as f, gzip.GzipFile(filename=path.name.removesuffix(".gz"), mode="wb", fileobj=f, mtime=0) as gz:
        gz.write(text)

    opt_state = opt_peak = 0
    if optimizer is not None:
        opt_state, opt_peak = _optimizer_on_meta(optimizer, params)
    info = {
        "model": type(model).__name__,
        "batch_size": batch_size(batch),
        "parameters_bytes": p_bytes,
        "gradients_bytes": g_bytes,
        "optimizer_state_bytes": opt_state,
        "optimizer_step_peak_bytes": opt_peak,
        "costs": costs.label if costs is not None else f"measured on {next(iter(params)).device.type if params else 'cpu'}",
        "recorded_on": "meta" if on_meta else (str(params[0].device) if params else "cpu"),
        "pins": pins(sink.records, sink.pinned),
    }
    Path(str(path) + ".info.json").write_text(json.dumps(info, indent=1))
    return StepRecording(path, info)
