"""Record a training step in the DTR trace format (REFERENCE.md section 6).

The recorder is a DTR region with no budget (nothing is evicted) whose every
event is also written as one JSON object per line, the format of the DTR
authors' logs that ``memscale replay`` (the Go CLI) and the engine's replay
runtime read::

    {"ANNOTATION":"START","INSTRUCTION":"ANNOTATE"}
    {"INSTRUCTION":"CONSTANT","NAME":"x0"}                 a tensor from outside
    {"INSTRUCTION":"MEMORY","MEMORY":"4096","NAME":"x0"}    (parameter, data)
    {"ARGS":["x0","x1"],"INSTRUCTION":"CALL","NAME":"mm","RESULT":["x2"],"TIME":"5120"}
    {"INSTRUCTION":"MEMORY","MEMORY":"65536","NAME":"x2"}   per result, in order,
    {"ALIAS":"-1","INSTRUCTION":"ALIAS","NAME":"x2"}        MEMORY then ALIAS
    {"ARGS":["x2"],"INSTRUCTION":"MUTATE","MUTATE":[0],"NAME":"relu_","TIME":"800"}
    {"DST":"x3","INSTRUCTION":"COPY","SRC":"x2"}            a new reference
    {"INSTRUCTION":"RELEASE","NAME":"x2"}                   a reference dropped
    {"ANNOTATION":"BACKWARD","INSTRUCTION":"ANNOTATE"}      autograd starts

Names are references: a name is made by ``CONSTANT``, a ``CALL`` result or a
``COPY``, and dropped by ``RELEASE``; ``MUTATE`` gives the mutated names new
versions in place (the old versions lose that reference). ``ALIAS`` is ``-1``
for fresh storage or the index into ``ARGS`` whose storage the result shares;
an alias's ``MEMORY`` is its view size, and it takes no memory of its own.
``TIME`` is the measured cost in nanoseconds (``time.perf_counter_ns`` around the
kernel on the CPU). ``detach``/``alias`` ops, which only make a new reference to
the same data, are written as ``COPY``. Tensors still referenced at the end
(the loss, gradients, parameters) are the step's outputs.

Use::

    with memscale.trace.record("step.log.gz"):
        loss = model(**batch).loss
        loss.backward()

or ``python -m memscale.trace --model gpt2 --out samples/traces/gpt2-small.log.gz``
to regenerate the recorded samples. :func:`read` and :func:`check` parse a trace
and verify that it is self-consistent.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

import torch

from ._region import DTRRegion
from .errors import MemscaleError

#: Ops that only make a new reference to the same data: written as COPY.
REFERENCE_OPS: Final[frozenset[str]] = frozenset({"detach", "alias", "lift_fresh"})

__all__ = ["TraceError", "TraceRecorder", "TraceSummary", "check", "read", "record"]

_dumps = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode
_graph_task_id = torch._C._current_graph_task_id


class TraceError(MemscaleError, ValueError):
    """A trace line is malformed or inconsistent (the message names the line)."""


class _Sink:
    """Receives the region's events and writes trace lines."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self.names: dict[int, str] = {}  # engine tensor id -> reference name
        self.next = 0
        self.backward = False
        self.lines = 0
        self.cells: dict[int, Any] = {}

    def _w(self, obj: dict[str, Any]) -> None:
        self.out.write(_dumps(obj))
        self.out.write("\n")
        self.lines += 1

    def _name(self, tid: int) -> str:
        name = self.names.get(tid)
        if name is None:
            name = f"x{self.next}"
            self.next += 1
            self.names[tid] = name
        return name

    def _check_backward(self) -> None:
        if not self.backward and _graph_task_id() != -1:
            self.backward = True
            self._w({"ANNOTATION": "BACKWARD", "INSTRUCTION": "ANNOTATE"})

    # -- events from the region ------------------------------------------

    def start(self, entry: Any) -> None:
        self.names = {}
        self._w({"ANNOTATION": "START", "INSTRUCTION": "ANNOTATE"})

    def stop(self) -> None:
        self.out.flush()

    def external(self, c: Any, nbytes: int) -> None:
        name = self._name(c.tensor_id)
        self._w({"INSTRUCTION": "CONSTANT", "NAME": name})
        self._w({"INSTRUCTION": "MEMORY", "MEMORY": str(nbytes), "NAME": name})

    def call(self, op: bytes, ins: list[Any], outs: list[Any], sizes: list[int], aliases: list[int], cost: int) -> None:
        self._check_backward()
        names = self.names
        args = [names[c.tensor_id] for c in ins]
        if len(outs) == 1 and aliases[0] == 0 and op.split(b".")[0].decode() in REFERENCE_OPS:
            self._w({"DST": self._name(outs[0].tensor_id), "INSTRUCTION": "COPY", "SRC": args[0]})
            return
        results = [self._name(c.tensor_id) for c in outs]
        self._w({"ARGS": args, "INSTRUCTION": "CALL", "NAME": op.decode(), "RESULT": results, "TIME": str(int(cost))})
        for name, size, alias in zip(results, sizes, aliases):
            self._w({"INSTRUCTION": "MEMORY", "MEMORY": str(int(size)), "NAME": name})
            self._w({"ALIAS": str(int(alias)), "INSTRUCTION": "ALIAS", "NAME": name})

    def mutate(self, op: bytes, ins: list[Any], mut: list[int], cost: int) -> None:
        self._check_backward()
        names = self.names
        args = [names[c.tensor_id] for c in ins]
        self._w({"ARGS": args, "INSTRUCTION": "MUTATE", "MUTATE": list(mut), "NAME": op.decode(), "TIME": str(int(cost))})

    def version(self, old: Any, new: Any) -> None:
        # A new version keeps the reference's name (MUTATE semantics).
        self.names[new.tensor_id] = self.names[old.tensor_id]

    def release(self, c: Any) -> None:
        name = self.names.get(c.tensor_id)
        if name is not None:
            self._w({"INSTRUCTION": "RELEASE", "NAME": name})

    def remat(self, op: int, cost: int) -> None:  # never happens: no budget
        pass

    def swap_in(self, tid: int) -> None:  # never happens: no budget
        pass


def _open_write(path: str | os.PathLike[str] | IO[str]) -> tuple[IO[str], bool]:
    if not isinstance(path, (str, os.PathLike)):
        return path, False
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.suffix == ".gz":
        # mtime=0: the same trace gives the same bytes (stable in git).
        raw = gzip.GzipFile(filename=p.name[:-3], mode="wb", fileobj=open(p, "wb"), mtime=0)
        return io.TextIOWrapper(raw, encoding="utf-8"), True
    return open(p, "w", encoding="utf-8"), True


class TraceRecorder:
    """Context manager that records everything run inside it as a DTR trace.

    Args:
        path: file to write (``.gz`` is compressed), or an open text stream.

    Attributes:
        region: the unbudgeted :class:`~memscale.dtr.DTRRegion` doing the
            recording (its :meth:`~memscale.dtr.DTRRegion.summary` gives the
            step's peak and compute).
        lines: number of trace lines written.
    """

    def __init__(self, path: str | os.PathLike[str] | IO[str]) -> None:
        self._path = path
        self._out: IO[str] | None = None
        self._owned = False
        self._sink: _Sink | None = None
        self.region: DTRRegion | None = None
        self.lines = 0

    def __enter__(self) -> TraceRecorder:
        if self._out is not None:
            raise MemscaleError("TraceRecorder: already recording")
        self._out, self._owned = _open_write(self._path)
        self._sink = _Sink(self._out)
        self.region = DTRRegion(None, sink=self._sink)
        try:
            self.region.__enter__()
        except BaseException:
            self._close()
            raise
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        assert self.region is not None
        try:
            self.region.__exit__(exc_type, exc, tb)
        finally:
            self._close()

    def _close(self) -> None:
        if self._sink is not None:
            self.lines = self._sink.lines
        if self._out is not None:
            if self._owned:
                self._out.close()
            else:
                self._out.flush()
        self._out = None

    def unwrap(self, t: Any) -> Any:
        """The plain tensor behind a recorded tensor."""
        assert self.region is not None
        return self.region.unwrap(t)


def record(path: str | os.PathLike[str] | IO[str]) -> TraceRecorder:
    """Record the ops run in the ``with`` block as a DTR trace at ``path``."""
    return TraceRecorder(path)


# ------------------------------------------------------------------ reading


def _open_read(path: str | os.PathLike[str]) -> IO[str]:
    p = Path(path)
    if p.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(p, "rb"), encoding="utf-8")
    return open(p, encoding="utf-8")


def read(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """The trace's JSON objects, one per line (``.gz`` is decompressed).

    Raises:
        TraceError: a line is not a JSON object with an ``INSTRUCTION``.
    """
    with _open_read(path) as f:
        for i, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceError(f"{path}:{i}: not JSON ({exc}): {line[:120]}") from exc
            if not isinstance(obj, dict) or "INSTRUCTION" not in obj:
                raise TraceError(f"{path}:{i}: not a trace instruction: {line[:120]}")
            yield obj


@dataclass
class TraceSummary:
    """What :func:`check` found in a trace.

    Attributes:
        instructions: count per instruction kind.
        constants_bytes: bytes of the ``CONSTANT`` tensors.
        compute_ns: the sum of ``TIME`` (the baseline compute).
        peak_bytes: peak memory of a replay with unlimited memory.
        outputs: names still referenced at the end.
        has_backward: whether ``ANNOTATE BACKWARD`` is present.
    """

    instructions: dict[str, int] = field(default_factory=dict)
    constants_bytes: int = 0
    compute_ns: int = 0
    peak_bytes: int = 0
    outputs: int = 0
    has_backward: bool = False


def check(path: str | os.PathLike[str]) -> TraceSummary:
    """Parse a trace, verify that it is self-consistent and replay it unbudgeted.

    Checked: replay starts at ``ANNOTATE START``; every name is defined
    (``CONSTANT``, ``CALL`` result, ``COPY``) before it is used and not used
    after its last reference was released; each ``CONSTANT`` is followed by its
    ``MEMORY`` line and each ``CALL`` result by its ``MEMORY`` and ``ALIAS``
    lines, in order; ``ALIAS`` and ``MUTATE`` index ``ARGS``; sizes and times
    are non-negative integers. Memory is counted per storage (a view joins the
    storage of the argument it aliases) and freed when no live reference names a
    tensor of it.

    Raises:
        TraceError: the first inconsistency, with its line number.
    """
    s = TraceSummary()
    started = False
    names: dict[str, int] = {}  # live name -> tensor
    tensor_storage: dict[int, int] = {}  # tensor -> storage
    tensor_refs: dict[int, int] = {}  # tensor -> live names
    storage_size: dict[int, int] = {}
    storage_live: dict[int, int] = {}  # storage -> tensors with live names
    pending: dict[str, int] = {}  # result name -> MEMORY size, until its ALIAS line
    expect: list[tuple[str, str, list[str] | None]] = []
    usage = 0
    next_id = 0

    def fail(i: int, msg: str) -> TraceError:
        return TraceError(f"{path}:{i}: {msg}")

    def num(i: int, obj: dict[str, Any], key: str, low: int = 0) -> int:
        v = obj.get(key)
        try:
            n = int(v)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise fail(i, f"{key} {v!r} is not an integer") from None
        if n < low:
            raise fail(i, f"{key} {n} is below {low}")
        return n

    def new_id() -> int:
        nonlocal next_id
        next_id += 1
        return next_id

    def place(t: int, storage: int, size: int | None) -> None:
        nonlocal usage
        tensor_storage[t] = storage
        if size is not None:  # a new storage: it allocates
            storage_size[storage] = size
            storage_live[storage] = 0
            usage += size
            s.peak_bytes = max(s.peak_bytes, usage)
        if tensor_refs.get(t, 0) > 0:
            storage_live[storage] += 1

    def name_it(name: str, t: int) -> None:
        names[name] = t
        tensor_refs[t] = tensor_refs.get(t, 0) + 1
        st = tensor_storage.get(t)
        if tensor_refs[t] == 1 and st is not None:
            storage_live[st] += 1

    def unname(t: int) -> None:
        nonlocal usage
        tensor_refs[t] -= 1
        if tensor_refs[t] == 0:
            st = tensor_storage.get(t)
            if st is not None:
                storage_live[st] -= 1
                if storage_live[st] == 0:
                    usage -= storage_size[st]

    def use(i: int, name: Any) -> int:
        t = names.get(name)
        if t is None:
            raise fail(i, f"name {name!r} is used but not defined (or was released)")
        return t

    for i, obj in enumerate(read(path), 1):
        kind = obj["INSTRUCTION"]
        if not started:
            if kind == "ANNOTATE" and obj.get("ANNOTATION") == "START":
                started = True
            continue
        s.instructions[kind] = s.instructions.get(kind, 0) + 1
        if expect:
            ekind, ename, eargs = expect.pop(0)
            if kind != ekind or obj.get("NAME") != ename:
                raise fail(i, f"expected {ekind} for {ename!r}, found {kind} {obj.get('NAME')!r}")
            t = names[ename]
            if kind == "MEMORY":
                size = num(i, obj, "MEMORY")
                if eargs is None:  # a constant: its own storage
                    s.constants_bytes += size
                    place(t, t, size)
                else:
                    pending[ename] = size
            else:  # ALIAS
                alias = num(i, obj, "ALIAS", low=-1)
                size = pending.pop(ename)
                if alias == -1:
                    place(t, t, size)
                else:
                    assert eargs is not None
                    if alias >= len(eargs):
                        raise fail(i, f"ALIAS {alias} of {ename!r} is outside ARGS ({len(eargs)} arguments)")
                    place(t, tensor_storage[names[eargs[alias]]], None)
            continue
        if kind in ("MEMORY", "ALIAS"):
            raise fail(i, f"{kind} for {obj.get('NAME')!r} does not follow a CONSTANT or CALL result")
        if kind == "ANNOTATE":
            if obj.get("ANNOTATION") == "BACKWARD":
                s.has_backward = True
        elif kind == "CONSTANT":
            name = obj.get("NAME")
            if not isinstance(name, str) or name in names:
                raise fail(i, f"CONSTANT {name!r}: missing or already a live name")
            name_it(name, new_id())
            expect.append(("MEMORY", name, None))
        elif kind == "CALL":
            args = obj.get("ARGS")
            results = obj.get("RESULT")
            if not isinstance(args, list) or not isinstance(results, list):
                raise fail(i, "CALL needs ARGS and RESULT lists")
            for a in args:
                use(i, a)
            s.compute_ns += num(i, obj, "TIME")
            for r in results:
                if not isinstance(r, str) or r in names:
                    raise fail(i, f"result {r!r} is not a new name")
                name_it(r, new_id())
                expect.append(("MEMORY", r, args))
                expect.append(("ALIAS", r, args))
        elif kind == "MUTATE":
            args = obj.get("ARGS")
            mut = obj.get("MUTATE")
            if not isinstance(args, list) or not isinstance(mut, list):
                raise fail(i, "MUTATE needs ARGS and MUTATE lists")
            for a in args:
                use(i, a)
            for m in mut:
                if not isinstance(m, int) or not 0 <= m < len(args):
                    raise fail(i, f"MUTATE index {m!r} is outside ARGS ({len(args)} arguments)")
            s.compute_ns += num(i, obj, "TIME")
            for m in mut:
                old = names[args[m]]
                t = new_id()
                tensor_refs[t] = 0
                place(t, t, storage_size[tensor_storage[old]])
                name_it(args[m], t)  # the name moves to the new version
                unname(old)
        elif kind in ("COPY", "COPY_FROM"):
            dst, src = obj.get("DST"), obj.get("SRC")
            if not isinstance(dst, str) or not isinstance(src, str):
                raise fail(i, f"{kind} needs DST and SRC names")
            t = use(i, src)
            if kind == "COPY":
                if dst in names:
                    raise fail(i, f"COPY to {dst!r}, which is already a live name")
            else:
                unname(use(i, dst))
            name_it(dst, t)
        elif kind == "RELEASE":
            t = names.pop(obj.get("NAME"), None)  # type: ignore[arg-type]
            if t is not None:
                unname(t)
        else:
            raise fail(i, f"unknown instruction {kind!r}")
    if not started:
        raise TraceError(f"{path}: no ANNOTATE START line")
    if expect:
        raise TraceError(f"{path}: ends before the {expect[0][0]} line of {expect[0][1]!r}")
    s.outputs = len(names)
    return s


# ----------------------------------------------------------- sample models


def _gpt2(batch: int, seq: int) -> tuple[Any, dict[str, Any]]:
    import transformers

    cfg = transformers.GPT2Config(n_layer=4, n_embd=256, n_head=4, n_positions=seq, vocab_size=2048)
    model = transformers.GPT2LMHeadModel(cfg)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(0))
    return model, {"input_ids": ids, "labels": ids}


def _bert(batch: int, seq: int) -> tuple[Any, dict[str, Any]]:
    import transformers

    cfg = transformers.BertConfig(
        num_hidden_layers=4,
        hidden_size=256,
        num_attention_heads=4,
        intermediate_size=1024,
        max_position_embeddings=seq,
        vocab_size=2048,
    )
    model = transformers.BertForMaskedLM(cfg)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g)
    labels = torch.where(torch.rand(batch, seq, generator=g) < 0.15, ids, torch.full_like(ids, -100))
    return model, {"input_ids": ids, "labels": labels}


_SAMPLES = {"gpt2": _gpt2, "bert": _bert}


def record_model(name: str, out: str | os.PathLike[str], *, batch: int = 8, seq: int = 128, seed: int = 0) -> TraceSummary:
    """Record one training step (forward and backward) of a sample model.

    ``name`` is ``"gpt2"`` (4 layers, width 256, 4 heads) or ``"bert"``
    (``BertForMaskedLM``, 4 layers, width 256); random weights, a vocabulary of
    2048 (so the logits do not dominate the step's memory and low budget ratios
    stay feasible), train mode (dropout on). Returns :func:`check` of the written trace.
    """
    if name not in _SAMPLES:
        raise MemscaleError(f"record_model: unknown model {name!r} (known: {', '.join(sorted(_SAMPLES))})")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(seed)
    model, batch_inputs = _SAMPLES[name](batch, seq)
    model.train()
    # One step before recording, so lazy initialisation is not in the trace.
    model(**batch_inputs).loss.backward()
    model.zero_grad(set_to_none=True)
    with record(out):
        loss = model(**batch_inputs).loss
        loss.backward()
    return check(out)


def main(argv: list[str] | None = None) -> int:
    """``python -m memscale.trace --model gpt2 --out FILE``: record a sample
    (``--check --out FILE``: verify an existing trace)."""
    p = argparse.ArgumentParser(prog="python -m memscale.trace", description=main.__doc__)
    p.add_argument("--model", choices=sorted(_SAMPLES), help="sample model to record (not with --check)")
    p.add_argument("--out", required=True, help="trace file (.log or .log.gz)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--check", action="store_true", help="only check an existing trace")
    args = p.parse_args(argv)
    if not args.check and args.model is None:
        p.error("--model is required to record (or give --check)")
    summary = check(args.out) if args.check else record_model(args.model, args.out, batch=args.batch, seq=args.seq, seed=args.seed)
    print(
        f"{args.out}: {sum(summary.instructions.values())} instructions "
        f"({', '.join(f'{k} {v}' for k, v in sorted(summary.instructions.items()))}), "
        f"constants {summary.constants_bytes} B, compute {summary.compute_ns / 1e6:.1f} ms, "
        f"unbudgeted peak {summary.peak_bytes} B, outputs {summary.outputs}, "
        f"backward {'yes' if summary.has_backward else 'no'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
