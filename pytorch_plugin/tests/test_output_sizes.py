"""Output-size prediction under a budget when an op's meta kernel under-reports
what it allocates (as the CPU ``mkldnn_rnn_layer``'s workspace does): the
region must not go over its budget once it has seen the op run."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from _helpers import python_region_only

from memscale import MemscaleError

torch = pytest.importorskip("torch")

try:
    from memscale import dtr
    from memscale._native.engine import dtr_lib
    from memscale._region.arguments import OUTPUT_SIZES

    dtr_lib()
except (ImportError, MemscaleError) as exc:  # pragma: no cover - without the engine
    pytest.skip(f"the DTR engine is unavailable: {exc}", allow_module_level=True)

MB = 1 << 20
N = MB // 4  # floats per 1 MiB


def _op(name: str):  # type: ignore[no-untyped-def]
    """A custom op returning ``(x * 2, a workspace of 4x x's bytes)`` whose
    fake (meta) kernel reports an empty workspace. A fresh name per test:
    what the predictor learns is kept per op for the process."""

    @torch.library.custom_op(f"memscale_test::{name}", mutates_args=())
    def with_workspace(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * 2, x.new_zeros(4 * x.numel())

    @with_workspace.register_fake
    def _(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.empty_like(x), x.new_empty(0)

    return with_workspace


def _step(op, x: torch.Tensor) -> torch.Tensor:  # type: ignore[no-untyped-def]
    a = x + 1
    b = a + 1
    c = b + 1  # x, a, b, c: 4 MiB
    out, workspace = op(c)  # 1 + 4 MiB more
    return (out + workspace[: out.numel()]).sum()


@pytest.fixture
def x() -> Iterator[torch.Tensor]:
    yield torch.ones(N)


@python_region_only("Python output-size table (OUTPUT_SIZES: its predictions are learned in C++)")
def test_an_unbudgeted_entry_teaches_the_budgeted_ones(x: torch.Tensor) -> None:
    op = _op("ws_taught")
    ref = _step(op, x)
    with dtr(None):
        _step(op, x)
    assert OUTPUT_SIZES.under_reported(torch.ops.memscale_test.ws_taught.default) == 5.0
    region = dtr(8 * MB, heuristic="dtr")
    with region:
        got = _step(op, x)
    assert torch.equal(got, ref)
    s = region.summary()
    assert s["evictions"] > 0 and s["peak_usage"] <= 8 * MB, s


@python_region_only("Python output-size table (OUTPUT_SIZES: its predictions are learned in C++)")
def test_a_budgeted_entry_learns_from_its_first_run(x: torch.Tensor) -> None:
    op = _op("ws_learned")
    func = torch.ops.memscale_test.ws_learned.default
    assert OUTPUT_SIZES.under_reported(func) == 1.0
    first = dtr(8 * MB, heuristic="dtr")
    with first:
        _step(op, x)
    # Nothing told the region the meta kernel under-reports: its first run
    # goes over by the workspace's unreported bytes, and is what teaches it.
    assert first.summary()["peak_usage"] == 9 * MB
    assert OUTPUT_SIZES.under_reported(func) == 5.0
    later = dtr(8 * MB, heuristic="dtr")
    with later:
        _step(op, x * 3)  # another tensor of the same signature
    assert later.summary()["peak_usage"] <= 8 * MB
    # A new signature (1.25 MiB tensors): its meta bytes, scaled, make room
    # for the op's 6.25 MiB next to 5 MiB of inputs under 10 MiB.
    bigger = dtr(10 * MB, heuristic="dtr")
    with bigger:
        _step(op, torch.ones(N + N // 4))
    s = bigger.summary()
    assert s["evictions"] > 0 and s["peak_usage"] <= 10 * MB, s
