"""PyTorch's own OpInfo corpus through a DTR region, bitwise against plain runs.

One test per OpInfo of ``op_db`` and ``foreach_op_db`` (id: the op's name,
``.variant`` when it has one). Each runs the op's first
:data:`opdb_corpus.SAMPLES` float32 CPU samples plainly (twice: a
nondeterministic op is skipped) and inside a fresh region, forward and
backward (``torch.autograd.grad`` of the outputs against fixed cotangents),
and compares outputs, gradients and the inputs afterwards bitwise. The region
is ``memscale.dtr(stress=True)`` (every evictable tensor evicted as soon as no
running op needs it, so every recomputation path runs) when ``memscale.dtr``
accepts it, else ``memscale.dtr(budget=None)``; ``MEMSCALE_OPDB_MODE`` picks
another (``opdb_corpus.MODES``).

Skipped, with the reason recorded: no float32 CPU support, no samples, every
sample failing plainly, a nondeterministic plain run, non-strided (sparse)
samples the region refuses with a :class:`memscale.MemscaleError` naming the
layout (any other error for them fails). The ops of
:data:`opdb_corpus.EXCEPTIONS` (PyTorch computes them another way for tensor
subclasses, which is every tensor while a dispatch mode is active) are
compared bitwise with the plain run under a do-nothing dispatch mode instead.
Anything else that differs or raises fails. The logic is in ``opdb_corpus.py``, shared with
``bench/opdb_report.py`` (which writes ``bench/results/opdb.md``).
"""

from __future__ import annotations

from typing import Any

import pytest
from _helpers import require_engine

torch = pytest.importorskip("torch")

require_engine()

import opdb_corpus as oc  # noqa: E402

SETTING = oc.Setting().resolved()
OPS = oc.corpus(foreach=True)


def _describe(outcome: oc.OpOutcome, setting: oc.Setting = SETTING) -> str:
    lines = [f"{outcome.op} in {oc.region_call(setting.mode)}:"]
    for s in outcome.samples:
        if s.status == "fail":
            lines.append(f"sample {s.index} (backward {'on' if s.backward else 'off'}): {s.reason}")
            lines.append(s.detail)
    return "\n".join(lines)


#: ``make test`` runs every 8th op of the corpus; ``make test-slow`` the rest.
FAST_EVERY = 8


@pytest.mark.parametrize(
    "op",
    [
        pytest.param(op, id=oc.op_id(op), marks=() if i % FAST_EVERY == 0 else (pytest.mark.slow,))
        for i, op in enumerate(OPS)
    ],
)
def test_op(op: Any) -> None:
    outcome = oc.run_op(op, SETTING)
    if outcome.status == "fail":
        pytest.fail(_describe(outcome), pytrace=False)
    if outcome.status == "skip":
        details = sorted({s.detail for s in outcome.samples if s.status == "skip" and s.detail})
        pytest.skip(f"{outcome.reason}" + (f" ({details[0]})" if details else ""))
    assert outcome.status in ("bitwise", "exception"), outcome
    if outcome.status == "exception":
        assert oc.op_id(op) in oc.EXCEPTIONS


#: Ops that update state as a side effect (running statistics written in
#: place, declared by the schema or not; RNG state) and ``prod`` (its gradient
#: takes PyTorch's subclass path): run in every test run in the harsh setting
#: (``opdb_corpus`` mode ``harsh``: everything evictable evicted after every op
#: and every re-run, rebuilt tensors included), where a re-run that repeats a
#: side effect changes the result.
HARSH_OPS: tuple[str, ...] = (
    "nn.functional.instance_norm",
    "nn.functional.batch_norm",
    "native_batch_norm",
    "_native_batch_norm_legit",
    "_batch_norm_with_update",
    "nn.functional.dropout",
    "nn.functional.rrelu",
    "bernoulli",
    "prod",
)
HARSH = oc.Setting(mode="harsh").resolved()


@pytest.mark.parametrize("name", HARSH_OPS)
def test_side_effects_run_once_in_the_harsh_setting(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The harsh setting reaches into the Python region, and so does the
    # evict-nothing run it is compared with (the same region, another setting).
    monkeypatch.setenv("MEMSCALE_NATIVE", "0")
    (op,) = [op for op in OPS if oc.op_id(op) == name]
    outcome = oc.run_op(op, HARSH)
    if outcome.status == "fail":
        pytest.fail(_describe(outcome, HARSH), pytrace=False)
    assert outcome.status in ("bitwise", "exception"), outcome
    if outcome.status == "exception":
        assert name in oc.EXCEPTIONS


def test_exceptions_name_ops_of_the_corpus() -> None:
    ids = {oc.op_id(op) for op in OPS}
    stale = sorted(set(oc.EXCEPTIONS) - ids)
    assert not stale, f"EXCEPTIONS names ops that are not in the corpus: {stale}"


def test_the_comparison_sees_one_ulp() -> None:
    a = torch.tensor([1.0, float("nan")])
    b = torch.tensor([torch.nextafter(torch.tensor(1.0), torch.tensor(2.0)).item(), float("nan")])
    same = oc.Run([a], None, [], set())
    oc._compare(same, oc.Run([a.clone()], None, [], set()), tolerance=False)
    with pytest.raises(AssertionError, match="output 0"):
        oc._compare(same, oc.Run([b], None, [], set()), tolerance=False)
    oc._compare(same, oc.Run([b], None, [], set()), tolerance=True)
