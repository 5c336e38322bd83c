"""The DTR region's mechanics, op by op, on the CPU against the real engine.

Each test forces evictions with a budget of a few tensors and the ``lru``
heuristic (so the oldest tensor goes first), then reads the evicted tensors and
compares them bitwise with the same computation done eagerly: views and
aliasing, in-place ops (also through views, and the old version of a mutated
tensor), ops with several outputs, RNG ops, tensors escaping the region,
parameters updated after it, swapping, bad budgets and bad arguments.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from _helpers import deadline, is_plain_tensor, is_region_tensor, python_region_only

from memscale import ConfigError, MemscaleError

torch = pytest.importorskip("torch")

try:
    from memscale._native import engine as _engine
    from memscale import DTRRegion, EvictedTensorError, dtr, unwrap

    _engine.dtr_lib()
except (ImportError, MemscaleError) as exc:  # pragma: no cover - without the engine
    pytest.skip(f"the DTR engine is unavailable: {exc}", allow_module_level=True)

from torch.utils._python_dispatch import _disable_current_modes, _get_current_dispatch_mode

MB = 1 << 20
N = 256 * 1024  # floats per 1 MiB tensor


@pytest.fixture(autouse=True)
def _deadline() -> Iterator[None]:
    """No test may hang."""
    with deadline(120):
        yield
    assert _get_current_dispatch_mode() is None, "a region left its dispatch mode behind"


def _eq(t: Any, ref: Any) -> bool:
    """Bitwise comparison that does not itself run through the region."""
    with _disable_current_modes():
        return bool(torch.equal(unwrap(t), ref))


def _resident(t: Any) -> bool:
    """Whether the Python region's tensor ``t`` holds its data (the tests that
    ask are marked ``RESIDENCY``: the native region has no such query)."""
    assert is_region_tensor(t)
    return t._c.tensor is not None


RESIDENCY = python_region_only("per-tensor residency query (a wrapper's cell is C++ state)")


def _x(seed: int = 0) -> Any:
    return torch.randn(256, 1024, generator=torch.Generator().manual_seed(seed))


def _fill(base: Any, n: int = 6) -> list[Any]:
    """``n`` fresh 1 MiB tensors: pushes the older ones out under a small budget."""
    return [base * float(i + 2) for i in range(n)]


def _region(budget_mb: float = 4.5, **kw: Any) -> DTRRegion:
    kw.setdefault("heuristic", "lru")
    return dtr(int(budget_mb * MB), **kw)


def _check_peak(region: DTRRegion) -> None:
    s = region.summary()
    assert 0 < s["peak_usage"] <= s["budget"], s


# ------------------------------------------------------------------ basics


def test_outputs_are_wrappers_inside_and_plain_results_outside() -> None:
    x = _x()
    region = dtr(None)
    with region:
        y = x * 2
        z = y.sum(dim=0)
        assert is_region_tensor(y) and is_region_tensor(z)
    assert is_plain_tensor(y + 1)  # a detached wrapper computes plainly
    assert torch.equal(y + 1, x * 2 + 1)
    assert is_plain_tensor(region.unwrap(z))
    assert torch.equal(unwrap(z), (x * 2).sum(dim=0))
    assert is_plain_tensor(y) and repr(y).startswith("tensor(")  # handed back at exit
    s = region.summary()
    assert s["entries"] == 1 and s["evictions"] == 0 and s["peak_usage"] >= 2 * MB


@RESIDENCY
def test_evicted_tensors_are_rebuilt_bitwise() -> None:
    x = _x()
    ref_a = x * 3
    ref_b = torch.tanh(ref_a) + 1
    region = _region()
    with region:
        a = x * 3
        b = torch.tanh(a) + 1
        keep = _fill(x)
        assert not _resident(a) and not _resident(b)
        assert _eq(b, ref_b)
        assert _eq(a, ref_a)
        del keep
    s = region.summary()
    assert s["evictions"] > 0 and s["rematerializations"] > 0
    assert s["bytes_evicted"] >= MB
    _check_peak(region)


# ------------------------------------------------------------------- views


@RESIDENCY
def test_views_share_the_storage_and_come_back_with_it() -> None:
    x = _x()
    ref = x * 2
    region = _region()
    with region:
        y = x * 2
        t = y.t()
        sl = y[10:20]
        fl = y.view(-1)
        keep = _fill(x)
        assert not _resident(y) and not _resident(t) and not _resident(sl)
        assert _eq(t, ref.t())
        assert _eq(sl, ref[10:20])
        assert _eq(fl, ref.view(-1))
        # every view of a rebuilt storage shares it
        with _disable_current_modes():
            assert unwrap(sl).untyped_storage().data_ptr() == unwrap(y).untyped_storage().data_ptr()
        del keep
    _check_peak(region)


def test_views_take_no_memory() -> None:
    x = _x()
    region = dtr(None)
    with region:
        y = x * 2
        views = [y.t(), y[1:], y.view(-1), y.unsqueeze(0), y.detach(), y.reshape(1024, 256)]
        usage = region.summary()  # running entry
    engine = region.last_summary()["engine"]
    assert engine["usage"] <= 2 * MB + 64, engine  # x and y, no view counted
    assert usage["peak_usage"] <= 2 * MB + 64
    del views


# ---------------------------------------------------------------- in-place


@RESIDENCY
def test_inplace_ops_create_new_versions() -> None:
    x = _x()
    ref_y = torch.relu(x * 2 + 1)
    ref_c = x * 2 * 3
    region = _region()
    with region:
        y = x * 2
        c = y * 3  # reads the old version of y
        y.add_(1)
        y.relu_()
        keep = _fill(x)
        assert not _resident(y) and not _resident(c)
        assert _eq(y, ref_y)
        assert _eq(c, ref_c)  # old version rebuilt from its lineage
        del keep
    assert region.summary()["rematerializations"] > 0
    _check_peak(region)


@RESIDENCY
def test_inplace_through_a_view_is_seen_by_the_base_and_other_views() -> None:
    x = _x()
    expect = x * 2
    expect[:8].mul_(3)
    expect_t = expect.t().clone()
    region = _region()
    with region:
        y = x * 2
        t = y.t()
        v = y[:8]
        v.mul_(3)
        assert _eq(y, expect)
        assert _eq(t, expect_t)
        keep = _fill(x)
        assert not _resident(y)
        assert _eq(t, expect_t)
        assert _eq(y, expect)
        assert _eq(v, expect[:8])
        del keep
    _check_peak(region)


def test_inplace_on_external_tensors_and_out_variants() -> None:
    x = _x()
    acc = torch.zeros(256, 1024)
    region = dtr(None)
    with region:
        y = x * 2
        acc.add_(y)  # external mutated in place: the user's tensor changes
        out = torch.empty(256, 1024)
        r = torch.add(y, 1, out=out)
        assert r is out
    assert torch.equal(acc, x * 2)
    assert torch.equal(out, x * 2 + 1)


@RESIDENCY
def test_inplace_view_ops_rebase_region_tensors() -> None:
    """squeeze_ / transpose_ / t_ on the region's own tensors (PyTorch's
    decompositions call them on intermediates: matmul of a vector, GRU with
    batch_first): the wrapper takes the new geometry, the old geometry stays
    what the recorded ops that read it see, and both rebuild bitwise."""
    x = _x()
    ref_y = (x * 2).t().unsqueeze(0)
    ref_before = (x * 2).sum(dim=1)
    region = _region()
    with region:
        y = x * 2
        before = y.sum(dim=1)  # reads the old geometry
        y.t_()
        y.unsqueeze_(0)
        assert y.shape == (1, 1024, 256) and y.stride() == ref_y.stride()
        keep = _fill(x)
        assert not _resident(y) and not _resident(before)
        assert _eq(y, ref_y)
        assert _eq(before, ref_before)
        assert _eq(y.squeeze_(0) + 1, ref_y.squeeze(0) + 1)
        del keep
    assert region.summary()["rematerializations"] > 0
    _check_peak(region)


def test_inplace_view_ops_inside_decompositions_and_autograd() -> None:
    v = torch.randn(1024, requires_grad=True)
    m = torch.randn(1024, 256, requires_grad=True)
    ref = torch.matmul(v, m).tanh().sum()  # matmul(vector, matrix) squeezes in place
    ref_grads = torch.autograd.grad(ref, (v, m))
    with dtr(None):
        out = torch.matmul(v, m).tanh().sum()
        grads = torch.autograd.grad(out, (v, m))
    assert _eq(out, ref) and all(_eq(g, r) for g, r in zip(grads, ref_grads))


@RESIDENCY
def test_inplace_view_ops_on_plain_tensors_change_them_as_in_eager_mode() -> None:
    x = _x()
    y = x.clone()
    region = _region()
    with region:
        before = y * 2  # computed from y's old geometry
        y.t_()
        assert is_plain_tensor(y) and y.shape == (1024, 256)
        after = y * 3
        keep = _fill(x)
        assert not _resident(before)
        assert _eq(before, x * 2) and _eq(after, x.t() * 3)
        del keep


@RESIDENCY
def test_conjugate_and_negative_views_keep_their_bits() -> None:
    """A lazily conjugated or negated view reads the same memory as its
    source; the wrapper, a re-derived view and a swapped-in view must all
    still read it conjugated / negated."""
    g = torch.Generator().manual_seed(3)
    z = torch.randn(128, 1024, dtype=torch.complex64, generator=g)
    ref_c = z.conj() * 1
    ref_n = torch._neg_view(z * 2) + 0
    for swap in (False, True):
        region = _region(6.5, recompute=not swap, swap=swap)  # swap only: never a timing choice
        with region:
            base = z * 1
            c = base.conj()
            n = torch._neg_view(base * 2)
            assert c.is_conj() and n.is_neg()
            assert _eq(c * 1, ref_c) and _eq(n + 0, ref_n)
            keep = _fill(z)
            assert not _resident(c)
            assert _eq(c * 1, ref_c)
            assert _eq(c, z.conj().resolve_conj())
            assert _eq(n + 0, ref_n)
            del keep
        s = region.summary()
        assert s["swaps_out"] > 0 if swap else s["rematerializations"] > 0


def test_tensors_without_storage_are_constants() -> None:
    """``sgn``'s backward makes an efficient zero tensor (no storage): it is
    handed back as it is, used as an argument like a scalar, never held."""
    x = torch.randn(1024, requires_grad=True)
    ref = torch.autograd.grad(torch.sgn(x).sum() + (x * 2).sum(), x)[0]
    with dtr(None):
        zero = torch._efficientzerotensor(4)
        assert zero._is_zerotensor() and is_plain_tensor(zero)
        grad = torch.autograd.grad(torch.sgn(x).sum() + (x * 2).sum(), x)[0]
        assert _eq(torch.ones(4) + zero, torch.ones(4))
    assert torch.equal(unwrap(grad), ref)


def test_reruns_use_the_grad_mode_of_the_first_run() -> None:
    """mkldnn_rnn_layer (LSTM on the CPU) returns its workspace only with grad
    mode on; backward re-runs it with grad mode off."""
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(32, 128, num_layers=2)
    x = torch.randn(16, 8, 32, requires_grad=True)
    ref = lstm(x)[0].square().mean()
    ref_grads = torch.autograd.grad(ref, [x, *lstm.parameters()])
    measure = dtr(None)
    with measure:
        torch.autograd.grad(lstm(x)[0].square().mean(), [x, *lstm.parameters()])
    region = dtr(int(measure.summary()["peak_usage"] * 0.8), heuristic="lru")
    with region:
        out = lstm(x)[0].square().mean()
        grads = torch.autograd.grad(out, [x, *lstm.parameters()])
    assert _eq(out, ref) and all(_eq(g, r) for g, r in zip(grads, ref_grads))
    assert region.summary()["rematerializations"] > 0


@RESIDENCY
@pytest.mark.parametrize(
    "norm",
    ["legit", "with_update", "instance"],
)
def test_normalization_with_running_statistics_rebuilds_from_their_old_values(norm: str) -> None:
    """Ops that write running statistics (declared mutable) and compute
    results: a rebuild reads the statistics as the first run did and never
    writes them again."""
    x = _x().view(64, 16, 256)
    stats = (torch.zeros(16), torch.ones(16))

    def run(xx: Any, rm: Any, rv: Any) -> Any:
        if norm == "legit":
            return torch.ops.aten._native_batch_norm_legit(xx, None, None, rm, rv, True, 0.1, 1e-5)[0]
        if norm == "with_update":
            return torch.ops.aten._batch_norm_with_update(xx, None, None, rm, rv, 0.1, 1e-5)[0]
        return torch.nn.functional.instance_norm(xx, rm, rv, use_input_stats=True)

    ref_stats = [t.clone() for t in stats]
    ref = [run(x * 2, *ref_stats), run(x * 3, *ref_stats)]
    region = _region(6.5)
    with region:
        ys = [run(x * 2, *stats), run(x * 3, *stats)]
        keep = _fill(x, 8)
        assert not _resident(ys[0])
        assert all(_eq(y, r) for y, r in zip(ys, ref))
        del keep
    assert region.summary()["rematerializations"] > 0
    assert all(torch.equal(a, b) for a, b in zip(stats, ref_stats))


# ---------------------------------------------------------- several outputs


@RESIDENCY
def test_ops_with_several_outputs() -> None:
    x = _x()
    ref = x * 2
    ev, ei = ref.topk(5, dim=1)
    em, eam = torch.max(ref, dim=1)
    eparts = ref.split(256, dim=1)
    es, emean = torch.std_mean(ref, dim=0)
    region = _region(6.5)
    with region:
        y = x * 2
        vals, idx = y.topk(5, dim=1)
        m, am = torch.max(y, dim=1)
        parts = y.split(256, dim=1)
        std, mean = torch.std_mean(y, dim=0)
        keep = _fill(x, 8)
        assert not _resident(y)
        assert _eq(vals, ev) and _eq(idx, ei)
        assert _eq(m, em) and _eq(am, eam)
        for p, q in zip(parts, eparts, strict=True):
            assert _eq(p, q)
        assert _eq(mean, emean) and _eq(std, es)
        del keep
    _check_peak(region)


@RESIDENCY
def test_one_output_of_a_multi_output_op_outlives_the_other() -> None:
    x = _x()
    ref_idx = torch.topk(x * 2, 256, dim=1)[1]
    ref_am = torch.max(x * 3, dim=1)[1]
    region = _region(6.5)
    with region:
        vals, idx = torch.topk(x * 2, 256, dim=1)
        m, am = torch.max(x * 3, dim=1)
        del vals, m  # dropped by the program; idx and am live on
        keep = _fill(x, 8)
        assert not _resident(idx)
        assert _eq(idx, ref_idx)  # re-running topk also re-makes the dropped values
        assert _eq(am, ref_am)
        del keep
    assert region.summary()["rematerializations"] > 0


# --------------------------------------------------------------------- RNG


@RESIDENCY
def test_rng_ops_replay_bitwise() -> None:
    x = _x()
    torch.manual_seed(7)
    e_drop = torch.nn.functional.dropout(x * 2, 0.5, training=True)
    e_rand = torch.rand(256, 1024)
    e_norm = torch.randn_like(x)
    e_after = torch.rand(3)
    region = _region(6.5)
    torch.manual_seed(7)
    with region:
        y = x * 2
        d = torch.nn.functional.dropout(y, 0.5, training=True)
        r = torch.rand(256, 1024)
        n = torch.randn_like(x)
        keep = _fill(x, 8)
        assert not _resident(d) and not _resident(r)
        assert _eq(d, e_drop)
        assert _eq(r, e_rand)
        assert _eq(n, e_norm)
        del keep
        after = torch.rand(3)  # replays left the generator where it was
    assert torch.equal(unwrap(after), e_after)
    assert region.summary()["rematerializations"] > 0


@RESIDENCY
def test_like_factories_read_only_the_metadata_of_their_template() -> None:
    """``empty_like(a)``, ``zeros_like``, ``new_ones``... take ``a`` for its size,
    strides, dtype and device only: rebuilding their result (a dropout mask
    made by ``empty_like(a).bernoulli_()``) must not rebuild ``a`` and its
    lineage first."""
    x = _x()

    def made_from(a: Any) -> list[Any]:
        return [
            torch.empty_like(a).bernoulli_(0.5),  # a dropout mask
            torch.rand_like(a.t()),
            torch.zeros_like(a.t()),
            torch.full_like(a, 2.0, dtype=torch.float64),
            a.new_ones((256, 512)),
        ]

    torch.manual_seed(3)
    ref_a = x * 3
    refs = made_from(ref_a)
    region = _region(5.5)
    torch.manual_seed(3)
    with region:
        a = x * 3
        made = made_from(a)
        keep = _fill(x, 8)
        assert not _resident(a) and not any(_resident(t) for t in made)
        for got, ref in zip(made, refs):
            assert _eq(got, ref)
            assert got.stride() == ref.stride() and got.dtype == ref.dtype
        assert not _resident(a), "rebuilding a *_like result rebuilt its template"
        assert _eq(a, ref_a)
        del keep, made, got  # nothing escapes the budget at exit
    assert region.summary()["rematerializations"] > 0
    _check_peak(region)


def test_like_factories_of_conjugate_views_keep_their_input() -> None:
    """A template with the conjugate bit is no plain strided tensor: it stays
    an input (the stand-in path does not take it), and the result is right."""
    z = torch.randn(64, 64, dtype=torch.complex64, generator=torch.Generator().manual_seed(1))
    ref = torch.ones_like(z.conj())
    with dtr(None):
        got = torch.ones_like(z.conj())
        assert _eq(got, ref) and unwrap(got).is_conj() == ref.is_conj()


def test_shape_only_ops_cover_pytorchs_own_list() -> None:
    """PyTorch's fake tensors keep the list of ``*_like`` / ``new_*``
    constructors; each of their non-mutating overloads takes the stand-in
    path here."""
    fake_impls = pytest.importorskip("torch._subclasses.fake_impls")
    ours = pytest.importorskip("memscale._region.schema")
    theirs = getattr(fake_impls, "_like_tensor_constructors", None)
    if theirs is None:
        pytest.skip("this torch keeps no list of like-constructors")
    missing = [
        str(op)
        for op in theirs
        if not op._schema.is_mutable and ours.OpInfo(op, True).shape_only is None
    ]
    assert not missing, f"not treated as reading only their template's metadata: {missing}"


@RESIDENCY
def test_batch_norm_replay_does_not_update_running_stats_twice() -> None:
    x = _x()
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm1d(1024)
    ref_bn = torch.nn.BatchNorm1d(1024)
    ref_y = ref_bn(x * 2)
    region = _region(6.5)
    with region:
        y = bn(x * 2)
        keep = _fill(x, 8)
        assert not _resident(y)
        assert _eq(y, ref_y)  # native_batch_norm re-ran on scratch statistics
        del keep
    assert region.summary()["rematerializations"] > 0
    assert torch.equal(bn.running_mean, ref_bn.running_mean)
    assert torch.equal(bn.running_var, ref_bn.running_var)
    assert int(bn.num_batches_tracked) == 1


def test_data_access_on_region_tensors() -> None:
    import copy

    x = _x()
    region = dtr(None)
    with region:
        y = x[:2, :3] * 2
        assert y.tolist() == (x[:2, :3] * 2).tolist()
        assert (y.numpy() == (x[:2, :3] * 2).numpy()).all()
        assert is_plain_tensor(copy.deepcopy(y))
        assert y.sum().item() == pytest.approx(float((x[:2, :3] * 2).sum()))
        assert bool((y * 0).sum() == 0)
    assert y.tolist() == (x[:2, :3] * 2).tolist()


@RESIDENCY
def test_a_failing_op_leaves_the_region_usable() -> None:
    x = _x()
    ref = x * 3
    region = _region()
    with region:
        a = x * 3
        with pytest.raises(RuntimeError):
            a @ torch.ones(3, 3)  # shape mismatch inside the kernel
        with pytest.raises(RuntimeError):
            a.add_(torch.ones(3))
        keep = _fill(x)  # inputs of the failed ops were not left locked: a can go
        assert not _resident(a)
        assert _eq(a, ref)
        del keep
    _check_peak(region)


@RESIDENCY
def test_a_plan_longer_than_the_buffer_grows_it() -> None:
    x = _x()
    ref = torch.tanh(torch.tanh(torch.tanh(x * 2) + 1) * 3)
    region = _region()
    with region:
        engine = region._session.engine
        engine._plan_kinds = (_engine._i32 * 1)()
        engine._plan_ids = (_engine._i64 * 1)()
        a = torch.tanh(torch.tanh(torch.tanh(x * 2) + 1) * 3)
        keep = _fill(x)
        assert not _resident(a)
        assert _eq(a, ref)  # a plan of several steps
        assert len(engine._plan_kinds) > 1
        del keep


# ------------------------------------------------------------ autograd/escape


@RESIDENCY
def test_escaping_tensors_are_materialized_at_exit() -> None:
    x = _x()
    region = _region()
    with region:
        a = x * 5
        keep = _fill(x)
        assert not _resident(a)
        del keep[2:]  # what leaves (x, a and two more: 4 MiB) fits the budget
    # a left the region evicted; it was rebuilt at exit, within the budget, and
    # handed back as a plain tensor
    assert is_plain_tensor(a)
    assert torch.equal(a * 1, x * 5)
    assert is_plain_tensor(a * 1)
    assert all(torch.equal(k * 1, x * float(i + 2)) for i, k in enumerate(keep))
    _check_peak(region)


def test_gradients_and_a_parameter_update_after_the_region() -> None:
    torch.manual_seed(0)
    lin = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Tanh(), torch.nn.Linear(1024, 1024))
    ref = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Tanh(), torch.nn.Linear(1024, 1024))
    ref.load_state_dict(lin.state_dict())
    x = _x()
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    # parameters 8 MiB, their gradients 8 MiB, x 1 MiB: 3 MiB for everything else
    region = dtr(20 * MB, heuristic="lru")
    for _ in range(2):
        ref_opt.zero_grad()
        ref(x).square().mean().backward()
        ref_opt.step()
        opt.zero_grad()
        with region:
            loss = lin(x).square().mean()
            loss.backward()
        for p in lin.parameters():
            assert is_plain_tensor(p.grad)
        opt.step()
    for p, q in zip(lin.parameters(), ref.parameters(), strict=True):
        assert torch.equal(p, q)
    _check_peak(region)


def test_backward_outside_the_region_uses_materialized_saved_tensors() -> None:
    w = torch.nn.Parameter(torch.randn(1024, 1024, generator=torch.Generator().manual_seed(1)) / 32)
    x = _x()
    (torch.tanh(x @ w) * 2).sum().backward()
    ref = w.grad.clone()
    w.grad = None
    region = dtr(None)
    with region:
        out = (torch.tanh(x @ w) * 2).sum()
    out.backward()  # autograd's saved tensors were made plain-usable at exit
    assert torch.equal(w.grad, ref)


def test_reentering_accumulates_the_summary() -> None:
    x = _x()
    ref = x * 2
    region = _region()
    for _ in range(3):
        with region:
            a = x * 2
            keep = _fill(x)
            assert _eq(a, ref)
            del keep
    s = region.summary()
    assert s["entries"] == 3
    assert s["evictions"] >= 3 and s["rematerializations"] >= 3
    assert s["overhead"] >= 1.0
    assert region.last_summary()["evictions"] >= 1


# ---------------------------------------------------------------------- swap


@RESIDENCY
def test_swap_instead_of_recompute() -> None:
    x = _x()
    ref_a = x * 3
    ref_b = ref_a + 1
    region = _region(recompute=False, swap=True)
    with region:
        a = x * 3
        b = a + 1
        keep = _fill(x)
        assert not _resident(a)
        assert _eq(b, ref_b)
        assert _eq(a, ref_a)
        del keep
    s = region.summary()
    assert s["swaps_out"] > 0 and s["swaps_in"] > 0
    assert s["rematerializations"] == 0
    _check_peak(region)


class _StandInEvent:
    """torch.cuda.Event for the CPU: recorded 0.5 ms apart; complete when
    ``done`` says so."""

    done = False
    made: list[_StandInEvent] = []

    def __init__(self, enable_timing: bool = False) -> None:
        self.t = 0.0

    def record(self, stream: Any = None) -> None:
        self.t = len(_StandInEvent.made) * 0.5
        _StandInEvent.made.append(self)

    def query(self) -> bool:
        return _StandInEvent.done

    def elapsed_time(self, end: _StandInEvent) -> float:
        return end.t - self.t


def _stand_in_timer(monkeypatch: pytest.MonkeyPatch) -> Any:
    from memscale._region.device import CudaTimer

    _StandInEvent.done = False
    _StandInEvent.made = []
    monkeypatch.setattr(torch.cuda, "Event", _StandInEvent)
    monkeypatch.setattr(CudaTimer, "_current_stream", lambda self: None)
    return CudaTimer()


def test_cuda_costs_come_from_events_read_without_syncing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA cost model with stand-in events: the host time until an op's
    device time is known, then the device time of the same (op, size)."""
    timer = _stand_in_timer(monkeypatch)
    key = ("op", 64)
    start = timer.start("op")
    assert timer.stop(key, start, host_ns=1000) == 1000  # nothing measured yet, no sync
    _StandInEvent.done = True
    start = timer.start("op")
    assert timer.stop(key, start, host_ns=1000) == 500_000  # the first op's 0.5 ms
    assert len(timer.pending) == 0 and timer.spare  # events are reused


def test_cuda_timer_samples_and_scales_unmeasured_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each op is timed on its first SAMPLES calls, then once every STRIDE
    calls; an untimed call of a measured size costs that size's device time,
    one of a size never measured the op's device time per byte times it."""
    timer = _stand_in_timer(monkeypatch)
    _StandInEvent.done = True
    timed = [timer.start("mm") is not None for _ in range(3 * timer.STRIDE)]
    assert timed[: timer.SAMPLES] == [True] * timer.SAMPLES
    assert sum(timed) == timer.SAMPLES + 2  # calls STRIDE and 2 x STRIDE
    assert timer.start("add") is not None  # counted per op
    start = timer.start("relu")
    assert timer.stop(("relu", 1000), start, host_ns=10) == 500_000
    assert timer.stop(("relu", 1000), None, host_ns=10) == 500_000  # untimed, known size
    assert timer.stop(("relu", 3000), None, host_ns=10) == 1_500_000  # untimed, scaled by bytes
    assert timer.stop(("gelu", 1000), None, host_ns=10) == 10  # nothing known: host time
    assert len(_StandInEvent.made) == sum(timed) + 3  # events only for timed calls: mm, add, relu (start, end)


@python_region_only("ctypes crossing fallback (the extension calls the engine's C ABI itself)")
def test_the_ctypes_fallback_runs_a_region_bitwise(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the C extension (no compiler, MEMSCALE_NO_EXTENSION) every op
    crosses into the engine through ctypes, with the same results."""
    from memscale._native import crossing as _crossing

    monkeypatch.setenv(_crossing.DISABLE_ENV, "1")
    _crossing.reset_for_tests()
    try:
        x = _x()
        ref = [(x * float(i + 2)).sin() for i in range(6)]
        region = _region()
        with region:
            assert region._session is not None and region._session.engine._op_fast is None
            ys = [(x * float(i + 2)).sin() for i in range(6)]
            assert not all(_resident(y) for y in ys)
            assert all(_eq(y, r) for y, r in zip(ys, ref))
            del ys  # nothing escapes: the peak stays within the budget
        s = region.summary()
        assert s["evictions"] > 0 and s["rematerializations"] > 0
        _check_peak(region)
    finally:
        _crossing.reset_for_tests()


def test_no_op_waits_for_the_device_and_what_waits_is_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """``summary()["synchronizations"]``: evictions, swaps and rebuilds add
    none; the fingerprints of verified rebuilds (memscale.check) and
    ``device.synchronize`` are counted, per entry and over the region."""
    from memscale._region import device

    x = _x()
    region = _region(swap=True)
    with region:
        a = x * 3
        b = a + 1
        keep = _fill(x)
        assert _eq(b, x * 3 + 1) and _eq(a, x * 3)
        del keep
    s = region.summary()
    assert s["evictions"] + s["swaps_out"] > 0 and s["rematerializations"] + s["swaps_in"] > 0
    assert s["synchronizations"] == 0 and region.last_summary()["synchronizations"] == 0

    stress = dtr(stress=True)
    stress.verify_where = lambda: "here"
    with stress:
        y = (x * 3).sin() + 1
        assert stress.summary()["synchronizations"] > 0  # the running entry's
        assert _eq(y, (x * 3).sin() + 1)  # rebuilt and verified
    first = stress.summary()["synchronizations"]
    assert first == stress.last_summary()["synchronizations"] > 0
    with stress:
        y = (x * 3).sin() + 1
        del y
    assert stress.summary()["synchronizations"] == first + stress.last_summary()["synchronizations"]

    waits: list[int] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: waits.append(1))
    before = device.sync_count()
    device.synchronize()
    assert waits == [1] and device.sync_count() == before + 1


# ---------------------------------------------------------------- bad input


def test_budget_below_the_largest_op_is_a_clear_error() -> None:
    x = _x()
    region = dtr(int(1.5 * MB))
    with pytest.raises(MemscaleError, match="budget"):
        with region:
            y = x * 2  # x (1 MiB, pinned) + y (1 MiB) do not fit
            y.sum()
    assert region._session is None  # left cleanly
    assert _get_current_dispatch_mode() is None
    region.budget = 8 * MB  # and usable again
    with region:
        y = x * 2
    assert torch.equal(y * 1, x * 2)


def test_budget_error_mid_backward_leaves_no_state_behind() -> None:
    lin = torch.nn.Linear(1024, 1024)
    x = _x()
    # Forward fits (weight 4 MiB + x + two activations); backward also needs the
    # weight's 4 MiB gradient, which does not.
    region = dtr(8 * MB)
    with pytest.raises(MemscaleError, match="budget"):
        with region:
            loss = lin(x).square().sum()
            loss.backward()
    assert region._session is None
    assert lin.weight.grad is None or is_plain_tensor(lin.weight.grad)
    lin.zero_grad(set_to_none=True)
    with dtr(None):
        lin(x).sum().backward()
    ref = torch.nn.Linear(1024, 1024)
    ref.load_state_dict(lin.state_dict())
    ref(x).sum().backward()
    assert torch.equal(lin.weight.grad, ref.weight.grad)


@RESIDENCY
def test_evicted_tensor_after_a_failed_region_raises_clearly() -> None:
    x = _x()
    region = _region()
    with pytest.raises(RuntimeError, match="boom"):
        with region:
            a = x * 2
            keep = _fill(x)
            assert not _resident(a)
            raise RuntimeError("boom")
    with pytest.raises(EvictedTensorError, match="exited with an error"):
        a + 1
    del keep


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"budget": "50%"}, "percentage"),
        ({"budget": 0}, "positive"),
        ({"budget": "lots"}, "budget"),
        ({"heuristic": "best"}, "heuristic"),
        ({"recompute": False}, "nothing could ever be evicted"),
        ({"recomp_time_factor": -1.0}, "recomp_time_factor"),
        ({"usage": "gpu"}, "usage"),
    ],
)
def test_bad_arguments_name_what_is_wrong(kwargs: dict[str, Any], match: str) -> None:
    budget = kwargs.pop("budget", None)
    with pytest.raises(ConfigError, match=match):
        dtr(budget, **kwargs)


def test_engine_rejections_surface_at_entry() -> None:
    region = dtr(MB, recomp_time_factor=float("inf"))  # Python lets it through, the engine does not
    with pytest.raises(MemscaleError, match="recomp_time_factor"):
        with region:
            pass
    assert _get_current_dispatch_mode() is None


def test_wrap_registers_a_plain_tensor() -> None:
    x = _x()
    ref = x * 2
    region = dtr(None)
    with pytest.raises(MemscaleError, match="not entered"):
        region.wrap(x)
    with region:
        w = region.wrap(x)
        assert is_region_tensor(w)
        assert _eq(w * 2, ref)
    assert torch.equal(region.unwrap(w), x)


@RESIDENCY
def test_region_tensors_pickle_as_plain_tensors(tmp_path: Any) -> None:
    """A checkpoint holding a region tensor loads with torch.load(weights_only=True)
    and without memscale: it pickles as the plain tensor."""
    import pickle

    x = _x()
    region = _region()
    with region:
        a = x * 3
        keep = _fill(x)
        assert not _resident(a)
        blob = pickle.dumps(a)  # rebuilt for the pickle
        del keep  # what leaves fits the budget
    inside = pickle.loads(blob)
    assert is_plain_tensor(inside) and torch.equal(inside, x * 3)
    path = tmp_path / "ckpt.pt"
    torch.save({"a": a}, path)
    assert b"memscale" not in path.read_bytes()
    loaded = torch.load(path, weights_only=True)["a"]
    assert is_plain_tensor(loaded) and torch.equal(loaded, x * 3)


def test_output_size_keys_hold_no_per_call_objects() -> None:
    """A new generator (or profiler handle) per call neither grows the size
    cache nor is kept alive by it, and an op that returns no tensor is never
    run on meta tensors (record_function's exit has effects)."""
    import gc
    import weakref

    from memscale._region.arguments import OUTPUT_SIZES

    region = _region()
    with region:
        before = len(OUTPUT_SIZES._bytes)
        refs = []
        for i in range(10):
            g = torch.Generator().manual_seed(i)
            refs.append(weakref.ref(g))
            with torch.autograd.profiler.record_function(f"step {i}"):
                t = torch.randint(0, 10, (64, 64), generator=g)
            del g
        assert len(OUTPUT_SIZES._bytes) - before <= 2
        del t
    gc.collect()
    assert all(r() is None for r in refs), "the size cache keeps generators alive"
