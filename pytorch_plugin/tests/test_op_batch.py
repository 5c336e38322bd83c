"""Batched registration: a region tells the engine about its ops in batches
(``memscale_dtr_ops``, ``MEMSCALE_OP_BATCH``), with the same results and the
same engine decisions as one call per op."""

from __future__ import annotations

import math
from typing import Any

import pytest
from _helpers import python_region_only

from memscale import ConfigError, MemscaleError

try:
    import torch

    from memscale import dtr
    from memscale._native.engine import Engine, dtr_lib
    from memscale._region import state as state_module

    dtr_lib()
except (ImportError, MemscaleError) as exc:  # pragma: no cover - without torch or the engine
    pytest.skip(f"torch or the DTR engine is unavailable: {exc}", allow_module_level=True)


class _Crossings:
    """Counts the engine's registration crossings: ``op`` (one op) and
    ``flush`` (a batch; only those that had something to send)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.op = 0
        self.batches = 0
        real_op, real_flush = Engine.op, Engine.flush

        def op(eng: Engine, *args: Any) -> Any:
            self.op += 1
            return real_op(eng, *args)

        def flush(eng: Engine, *args: Any) -> Any:
            if eng.queued or eng.released:
                self.batches += 1
            return real_flush(eng, *args)

        monkeypatch.setattr(Engine, "op", op)
        monkeypatch.setattr(Engine, "flush", flush)


def _chain(y: torch.Tensor, n: int) -> torch.Tensor:
    for _ in range(n):
        y = torch.tanh(y * 1.01)
    return y


@python_region_only("Python Engine.op/flush crossings to count (it batches from C++ through the C ABI)")
@pytest.mark.parametrize("batch", [None, "1", "7"])
def test_a_chain_crosses_once_per_batch(batch: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    if batch is None:
        monkeypatch.delenv(state_module.OP_BATCH_ENV, raising=False)
    else:
        monkeypatch.setenv(state_module.OP_BATCH_ENV, batch)
    size = state_module.OP_BATCH if batch is None else int(batch)
    crossings = _Crossings(monkeypatch)
    x = torch.ones(16, 16)
    with dtr(None):
        out = _chain(x, 100)  # 200 ops
    assert torch.equal(out, _chain(x, 100))
    if size == 1:
        assert (crossings.op, crossings.batches) == (200, 0)
    else:
        # Full batches, then what is left at the exit.
        assert crossings.op == 0
        assert 200 // size <= crossings.batches <= math.ceil(200 / size) + 1, crossings.batches


@pytest.mark.parametrize("batch", ["1", "32"])
def test_budgeted_steps_are_bitwise_and_within_the_budget(batch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(state_module.OP_BATCH_ENV, batch)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[m for _ in range(6) for m in (torch.nn.Linear(128, 128), torch.nn.Tanh())])
    x = torch.randn(1024, 128)

    def step() -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    ref_loss, ref_grads = step()
    probe = dtr(None)
    with probe:
        step()
    peak, floor = probe.summary()["peak_usage"], probe.summary()["min_budget"]
    region = dtr(max(peak // 2, floor * 5 // 4), heuristic="dtr")
    for _ in range(2):
        with region:
            loss, grads = step()
        assert torch.equal(loss, ref_loss)
        assert all(torch.equal(a, b) for a, b in zip(grads, ref_grads, strict=True))
    s = region.summary()
    assert s["evictions"] > 0 and 0 < s["peak_usage"] <= s["budget"], s


@pytest.mark.parametrize("raw", ["0", "-3", "many", "1.5", "65537", "99999999999999999999999"])
def test_a_malformed_batch_size_is_refused_at_entry(raw: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from memscale._native import lib

    lib.check_configuration()  # the library reads its variables once, before this test's
    monkeypatch.setenv(state_module.OP_BATCH_ENV, raw)
    region = dtr(None)
    # The library checks the variable too, at the region's engine creation:
    # whichever speaks first names the variable, the value and the range.
    with pytest.raises(MemscaleError, match=rf"MEMSCALE_OP_BATCH=.{raw}.: .*1 to 65536"):
        with region:
            pass
