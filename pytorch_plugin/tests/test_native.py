"""The native region (``MEMSCALE_NATIVE=1``): its per-op path in C++.

Each test runs a program plainly and in a native region, under the stress
setting (everything evictable evicted after every op, rebuilt when read) or
a budget, and compares bitwise: outputs, gradients, and what in-place ops
left in the program's tensors. ``make test-native`` runs this file with the
op_db corpus, the zoo and the escapes on the native path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import memscale
from _helpers import force_native, is_plain_tensor, is_region_tensor, require_engine
from memscale._native import region_ext
from memscale.errors import ConfigError, MemscaleError

require_engine()


_native = pytest.fixture(autouse=True)(force_native)


def _ext() -> Any:
    ext = region_ext.extension()
    assert ext is not None
    return ext


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return bool(a == b)


def _compare(program: Callable[[], Any], region: Callable[[], Any]) -> memscale.DTRRegion:
    """Run ``program`` plainly and in ``region()``; assert bitwise equal results."""
    torch.manual_seed(7)
    plain = program()
    torch.manual_seed(7)
    r = region()
    with r:
        got = program()
    assert r.native, "the entry did not run on the native path"
    assert _same(plain, got), f"native results differ: {plain} vs {got}"
    return r


def _mlp() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(64, 64), torch.nn.Tanh(),
        torch.nn.Linear(64, 1),
    )
    return model, torch.randn(16, 32)


def _train_step(model: torch.nn.Module, x: torch.Tensor) -> Callable[[], Any]:
    def step() -> Any:
        model.zero_grad(set_to_none=True)
        loss = model(x).pow(2).mean()
        loss.backward()
        return loss.detach()

    return step


@pytest.mark.parametrize("setting", ["unbudgeted", "stress", "budget"])
def test_training_step_is_bitwise(setting: str) -> None:
    model, x = _mlp()
    step = _train_step(model, x)
    probe = memscale.dtr(None)
    with probe:
        step()
    peak = probe.summary()["peak_usage"]
    regions = {
        "unbudgeted": lambda: memscale.dtr(None),
        "stress": lambda: memscale.dtr(stress=True),
        # LRU: victims independent of measured op costs, so the run is the same every time.
        "budget": lambda: memscale.dtr(int(peak * 0.9), heuristic="lru"),
    }
    torch.manual_seed(7)
    plain = step()
    plain_grads = [p.grad.clone() for p in model.parameters()]
    torch.manual_seed(7)
    r = regions[setting]()
    with r:
        loss = step()
    assert r.native
    assert torch.equal(plain, loss)
    assert all(torch.equal(a, p.grad) for a, p in zip(plain_grads, model.parameters()))
    if setting != "unbudgeted":
        assert r.summary()["evictions"] > 0
        assert r.summary()["rematerializations"] > 0


def test_wrappers_inside_plain_tensors_after() -> None:
    ext = _ext()
    x = torch.randn(4, 4)
    with memscale.dtr(None) as r:
        y = x * 2
        assert ext.is_wrapper(y)
        assert not ext.is_wrapper(x)
        assert y.tolist() == (x * 2).tolist()
        assert "tensor(" in repr(y)
    assert r.native
    assert not ext.is_wrapper(y), "an escaping tensor is handed back as a plain tensor"
    assert torch.equal(y, x * 2)
    assert f"{y.sum():.3f}" == f"{(x * 2).sum():.3f}"


def test_gradients_are_plain_after_the_step() -> None:
    ext = _ext()
    model, x = _mlp()
    with memscale.dtr(stress=True):
        model(x).sum().backward()
    for p in model.parameters():
        assert p.grad is not None and not ext.is_wrapper(p.grad)


def test_in_place_ops_on_region_tensors_and_views() -> None:
    base = torch.randn(6, 5)

    def program() -> Any:
        a = base * 3
        v = a[1:4]
        v.add_(1)  # a view written: its base sees it
        a.mul_(2)
        b = a.relu_()
        c = v.t().contiguous()
        return [a.clone(), b.clone(), c.clone(), v.sum()]

    _compare(program, lambda: memscale.dtr(stress=True))


def test_in_place_on_an_external_a_recorded_op_read() -> None:
    # Copy-on-write: the external's old data is what the rebuilt ops read.
    def program() -> Any:
        stats = torch.zeros(8)
        x = torch.randn(8)
        y = (x + stats).exp()  # reads stats, recorded
        stats.add_(1)  # overwrites it in the program
        z = y * 2  # y evicted under stress: rebuilt from the old stats
        return [z.clone(), stats.clone()]

    _compare(program, lambda: memscale.dtr(stress=True))


def test_batch_norm_running_statistics_update_once() -> None:
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm1d(4)
    x = torch.randn(8, 4, requires_grad=True)

    def program() -> Any:
        x.grad = None
        bn.reset_running_stats()
        out = bn(x * 2).sum()
        out.backward()
        return [out.detach(), bn.running_mean.clone(), bn.running_var.clone(), x.grad.clone()]

    _compare(program, lambda: memscale.dtr(stress=True))
    x.grad = None


def test_random_ops_are_replayed() -> None:
    x = torch.randn(32, 32, requires_grad=True)

    def program() -> Any:
        y = torch.nn.functional.dropout(x * 2, 0.5).tanh()
        z = torch.rand_like(y) * y
        z.sum().backward()
        grad = x.grad.clone()
        x.grad = None
        return [z.detach(), grad]

    _compare(program, lambda: memscale.dtr(stress=True))


def test_python_numbers_in_re_runs_keep_their_type_promotion() -> None:
    """A record keeps a Python number passed as a tensor (``y * 0.1``) as the
    number and makes a wrapped-number tensor of it again at a re-run: the
    flag decides type promotion (a float16 tensor times a Python float stays
    float16; times a float64 tensor it would be float64), and the value's
    type decides the tensor's (int, float, bool, complex)."""

    def program() -> Any:
        h = torch.arange(12, dtype=torch.float16).reshape(3, 4)
        i = torch.arange(12).reshape(3, 4)
        a = h * 0.1 + 3
        b = (i * 2 + True) // 3
        c = torch.where(i > 5, i, 7) - 1.5
        d = torch.arange(4.0).to(torch.complex64) * (1 + 2j)
        return [a * 2, b + 1, c * 1, d + 0, a.dtype, b.dtype, c.dtype, d.dtype]

    r = _compare(program, lambda: memscale.dtr(stress=True))
    assert r.summary()["rematerializations"] > 0, "nothing was re-run: the test shows nothing"


def test_shape_changes_in_place() -> None:
    def program() -> Any:
        a = torch.arange(12.0).reshape(3, 4) * 1.5
        a.t_()
        a.unsqueeze_(0)
        b = a + 1
        return [a.clone(), b.clone(), list(a.shape)]

    _compare(program, lambda: memscale.dtr(stress=True))


def test_shape_only_factories_do_not_rebuild_their_template() -> None:
    def program() -> Any:
        a = torch.randn(5, 5).exp()
        b = torch.zeros_like(a) + torch.ones_like(a)
        return [b.clone(), a.clone()]

    _compare(program, lambda: memscale.dtr(stress=True))


def test_out_ops_resize_the_programs_tensor() -> None:
    # torch.arange(n) fills an empty tensor through arange.start_out, which
    # resizes it: the program's tensor must be what grows (it came back empty).
    def program() -> Any:
        n = torch.randn(3, 4).exp().shape[0]
        target = torch.arange(n)
        out = torch.empty(0)
        torch.cat([torch.ones(2), torch.zeros(3)], out=out)
        return [target.clone(), out.clone()]

    _compare(program, lambda: memscale.dtr(stress=True))


def test_legacy_constructor_on_a_region_tensor() -> None:
    # Reformer: sorted_idx.new(*sorted_idx.size()) (the device came from the key).
    with memscale.dtr(None) as r:
        x = torch.arange(6).reshape(2, 3) * 2
        y = x.new(*x.size()).fill_(1)
        z = x.new([1, 2])
        assert (y.dtype, y.shape, z.tolist()) == (x.dtype, x.shape, [1, 2])
    assert r.native


def test_check_runs_on_the_native_path() -> None:
    model, x = _mlp()
    report = memscale.check(model, x)
    assert report.safe, report
    assert report.rematerializations > 0


def test_native_env_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMSCALE_NATIVE", "yes")
    with pytest.raises(ConfigError, match="MEMSCALE_NATIVE"):
        with memscale.dtr(None):
            pass


def test_what_the_native_path_lacks_is_refused_when_forced() -> None:
    from memscale._region.region import DTRRegion

    r = DTRRegion(None, sink=object())  # a trace recorder: the Python region's only
    with pytest.raises(MemscaleError, match="does not support trace recording"):
        with r:
            pass


def test_python_path_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMSCALE_NATIVE", "0")
    with memscale.dtr(None) as r:
        y = torch.ones(3) * 2
    assert not r.native
    assert torch.equal(y, torch.full((3,), 2.0))


def test_a_budget_set_mid_entry_sees_the_queued_ops() -> None:
    # With room under the budget registrations are queued (memscale_dtr_ops,
    # ids predicted); a lower budget set inside the entry sends them first, so
    # the engine evicts what the queue registered and the step stays bitwise.
    model, x = _mlp()
    torch.manual_seed(3)
    chain = [x]
    for _ in range(150):
        chain.append(chain[-1] * 1.01)
    plain = chain[-1].sum()
    r = memscale.dtr(1 << 40, heuristic="lru")
    torch.manual_seed(3)
    with r:
        y = x
        kept = []
        for i in range(150):
            y = y * 1.01
            kept.append(y)
            if i == 100:
                r.budget = 110 * y.nbytes
        kept.clear()  # what escapes must fit the budget at the exit: only the sum does
        got = y.sum()
    assert r.native
    s = r.summary()
    assert s["evictions"] > 0  # tensors registered through the queue, evicted once the budget came
    assert torch.equal(plain, got)


@pytest.mark.parametrize("native", ["0", "1"])
@pytest.mark.parametrize("phase", ["forward", "backward"])
def test_a_budget_below_the_step_raises_no_room_on_both_paths(
    monkeypatch: pytest.MonkeyPatch, native: str, phase: str
) -> None:
    """One error whichever path runs the op: memscale run and the planner's
    probes catch NoRoomError (a RuntimeError), not any RuntimeError."""
    from memscale._native.engine import NoRoomError

    monkeypatch.setenv("MEMSCALE_NATIVE", native)
    torch.manual_seed(0)
    w = torch.randn(256, 256, requires_grad=True)  # 256 KiB, pinned
    x = torch.randn(512, 256)  # 512 KiB, pinned; each op's output another 512 KiB
    r = memscale.dtr(1 << 40)
    with pytest.raises(NoRoomError, match="nothing evictable"):
        with r:
            if phase == "forward":
                r.budget = 1 << 20  # below the inputs, one op's output and what it reads
            h = x
            for _ in range(4):
                h = torch.tanh(h @ w)
            if phase == "backward":
                r.budget = 1 << 20  # the forward fitted; its backward does not
            h.pow(2).sum().backward()
    assert r.native == (native == "1")


# A region tensor holds its storage while resident (issue 28): code that reads
# data pointers directly works on it, an eviction takes the storage away (and
# frees it), a rebuild gives it back.


def test_data_pointer_while_resident_rebuilt_after_eviction_error_once_gone() -> None:
    from torch.multiprocessing.reductions import StorageWeakRef

    ext = _ext()
    x = torch.randn(64, 256)  # 64 KiB, an external (pinned)
    r = memscale.dtr(1 << 40, heuristic="lru")
    with r:
        y = x * 2
        v = y[1:]
        assert ext.is_wrapper(y) and ext.is_wrapper(v)
        assert y.data_ptr() == ext.unwrap(y).data_ptr()
        assert v.data_ptr() == y.data_ptr() + 256 * 4  # a view: its offset into its base's storage
        assert v.untyped_storage().data_ptr() == y.data_ptr()
        w = x * 3  # its data pointer is not taken: evictable
        freed = StorageWeakRef(ext.unwrap(w).untyped_storage())
        session = r._session
        session.native.flush()
        before = session.status.usage
        # Room for x, y (locked: its data pointer was taken) and z: w is evicted.
        r.budget = 3 * x.nbytes + x.nbytes // 2
        z = x + 1
        session.native.flush()
        assert r.summary()["evictions"] > 0
        assert session.status.usage <= before, "w's bytes are still counted"
        assert freed.expired(), "a wrapper (or its cell) kept an evicted storage alive"
        assert y.data_ptr() == ext.unwrap(y).data_ptr()  # y stayed resident
        r.budget = 1 << 40
        assert w.data_ptr() == ext.unwrap(w).data_ptr()  # taking it rebuilds it
        assert torch.equal(w, x * 3)
        assert session.native.counters()["exposed"] == 3  # y, v and w: locked until released
        assert torch.equal(torch.nn.functional.max_pool1d(w.unsqueeze(0), 2),
                           torch.nn.functional.max_pool1d((x * 3).unsqueeze(0), 2))
        del z
    assert r.native
    # Evicted in an entry that exited with an error: nothing can rebuild it.
    with pytest.raises(ZeroDivisionError):
        with memscale.dtr(stress=True):
            gone = x * 4  # evicted as soon as it is made
            raise ZeroDivisionError
    for read in (gone.data_ptr, gone.untyped_storage):
        with pytest.raises((RuntimeError, NotImplementedError), match="evicted its storage"):
            read()


@pytest.mark.parametrize("setting", ["unbudgeted", "stress"])
def test_ops_that_read_data_pointers(setting: str) -> None:
    # Canine's max_pool1d without grad on the CPU and wav2vec2's ctc_loss with
    # tensor lengths read their inputs' data pointers directly (their
    # CompositeImplicitAutograd fast paths for tensors that are not subclass-like).
    def program() -> Any:
        torch.manual_seed(0)
        chars = torch.randn(2, 8, 32)
        log_probs = torch.randn(40, 3, 12, requires_grad=True)
        targets = torch.randint(1, 12, (3, 15))
        mask = torch.ones(3, 40, dtype=torch.long)
        mask[1, 30:] = 0
        label_mask = (targets > 3).long()
        with torch.no_grad():
            pooled = torch.nn.functional.max_pool1d(chars.tanh(), kernel_size=4, stride=4)
        input_lengths = mask.sum(-1)  # region tensors, as wav2vec2 computes them
        target_lengths = label_mask.sum(-1)
        loss = torch.nn.functional.ctc_loss(
            log_probs.log_softmax(2), targets, input_lengths, target_lengths, zero_infinity=True
        )
        int_loss = torch.nn.functional.ctc_loss(
            log_probs.log_softmax(2), targets, input_lengths.int(), target_lengths.int(), reduction="sum"
        )
        (loss + int_loss).backward()
        return [pooled, loss.detach(), int_loss.detach(), log_probs.grad]

    regions = {"unbudgeted": lambda: memscale.dtr(None), "stress": lambda: memscale.dtr(stress=True)}
    _compare(program, regions[setting])



def test_a_backward_pass_that_raised_ends_the_watched_entry() -> None:
    """With ``ends_on_failed_backward`` a backward pass of the entry that
    raised (the program caught it) is seen in C++ at the next op: that op and
    every op after it run plainly, and ``failed_backward`` says so; a pass
    that completes, or an entry not watching, changes nothing."""
    import test_api
    from memscale._region.native import is_native_tensor

    def entry(watch: bool, raises: bool) -> tuple[bool, bool, bool]:
        region = memscale.dtr(None)
        region.ends_on_failed_backward = watch
        x = torch.randn(64, 8, requires_grad=True)
        with region:
            y = test_api._FailsInBackward.apply(x * 2.0)
            test_api._FailsInBackward.armed = raises
            try:
                y.sum().backward()
            except RuntimeError as exc:
                assert "simulated" in str(exc)
            finally:
                test_api._FailsInBackward.armed = False
            made = torch.ones(16) * 3.0
            failed = region.failed_backward is not None
            again = torch.ones(16) + made
            seen = failed, is_native_tensor(made), is_native_tensor(again)  # at exit they become plain
        assert region.native
        return seen

    assert entry(watch=True, raises=True) == (True, False, False)
    assert entry(watch=True, raises=False) == (False, True, True)
    assert entry(watch=False, raises=True) == (False, True, True)


def test_a_step_whose_backward_raised_ends_on_the_native_path() -> None:
    """The drop-in step watches its backward passes in C++: one that raised
    (and the loop caught) ends the step, and what the loop does next runs
    plainly, bitwise the plain loop (test_api's test, on the native path)."""
    import test_api

    test_api.test_a_step_whose_backward_raised_is_over_when_the_loop_goes_on(None)


def test_device_events_give_the_engine_each_ops_device_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where an op's results live on a device with timing events (CUDA), the
    engine hears its device time, read from events without waiting: the first
    result starts the timer, the first calls of an op and one in 32 after
    are timed, the others cost what their (op, size) last measured; the host
    time when it is larger. On the CPU the test's events say 7 us per call
    against 1 us of host time (device_timer.h)."""
    import memscale._region.native as native

    x = torch.randn(64, 64)

    def costs(device_ns: int) -> tuple[int, int]:
        monkeypatch.setattr(native, "TEST_OP_COST", (1000, 0))
        monkeypatch.setattr(native, "TEST_DEVICE_NS", device_ns)
        region = memscale.dtr(None)
        with region:
            y = x
            for _ in range(40):
                y = y * 1.0001
            timed = region._session.counters()["device_timed"]
        return int(region.summary()["base_cost_ns"]), timed

    assert costs(0) == (40 * 1000, 0)  # host times only
    # The first call starts the timer (host time); calls 2-5 and 34 are timed; all later ones cost 7 us.
    assert costs(7000) == (1000 + 39 * 7000, 5)


def test_inference_mode_runs_as_outside_the_region() -> None:
    """Under torch.inference_mode the native region's ops run plainly (a
    wrapper would be an inference tensor, which autograd's view tracking
    refuses for a view of a normal tensor, as linear's weight.t() is)."""
    from memscale._region.native import is_native_tensor

    x, w = torch.randn(4, 8), torch.randn(3, 8)
    with torch.inference_mode(), memscale.dtr(None) as region:
        y = torch.nn.functional.linear(x, w)
        inside = is_native_tensor(y)
    assert region.native and not inside
    assert torch.equal(y, x @ w.T)


def test_an_exit_that_cannot_fit_what_leaves_carries_the_steps_stats() -> None:
    """What leaves the step does not fit the budget: the NoRoomError says so
    and carries the step's stats, as on the Python path."""
    from memscale._native.engine import NoRoomError

    mib = 1 << 20
    x = torch.randn(mib // 4)
    with pytest.raises(NoRoomError, match="is below what leaves this step") as err:
        with memscale.dtr(budget=3 * mib, heuristic="lru"):
            kept = [x * float(k + 2) for k in range(4)]  # noqa: F841 - four 1 MiB results leave
    assert int(err.value.stats["peak_usage"]) > 0  # type: ignore[attr-defined]


def test_a_rebuild_plan_of_any_length() -> None:
    """A tensor at the end of a chain whose every link was dropped: its plan
    re-runs the whole chain (1,100 steps; the native region's plan buffer held
    1,024 once and refused longer plans)."""
    x = torch.randn(1024)  # 4 KiB: above the smallest size the engine evicts
    r = memscale.dtr(1 << 40, heuristic="lru")
    with r:
        y = x * 1
        for _ in range(1099):
            y = y * 1.0001  # each link released once the next is made: dropped at once (eager)
        r.budget = 2 * x.nbytes  # x (pinned) and nothing else: y is evicted too
        z = x + 1
        r.budget = 1 << 40
        got = y * 1  # y's plan: the 1,100 ops again
        assert r._session.native.counters()["reruns"] >= 1100
        del z
    want = x * 1
    for _ in range(1099):
        want = want * 1.0001
    assert torch.equal(got, want)


def test_parking_takes_a_locked_view_whose_storage_came_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """GPT-2 (2 layers) with activation checkpointing, one step at 1.1 x its
    ``min_budget``: the backward's rebuilds nest, and an op's input that is a
    view (locked by the op's level) gets its storage back while the other
    input's nested plans run, with no tensor until its view op re-runs. The
    parking of outer levels skipped it for that (it looked at the cell's
    tensor, not its storage), so the inner plan's next step found nothing
    evictable: NoRoomError after 4 nested restarts, where the Python region
    parks it and trains. Bitwise equal to plain PyTorch, within the budget."""
    pytest.importorskip("transformers")
    import warnings

    import zoo
    from _helpers import steady_clock

    steady_clock(monkeypatch)  # op costs fixed: the engine's victims depend on the program alone
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tf = zoo._transformers()
        cfg = tf.GPT2Config(
            n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64, bos_token_id=0, eos_token_id=0,
            use_cache=False,
        )
        torch.manual_seed(0)
        model = tf.GPT2LMHeadModel(cfg)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            model.gradient_checkpointing_enable()
        model.train()
        gpt2 = zoo.ZooModel("gpt2_ckpt_2", model, lambda step: zoo._lm_batch(10, step, 128, (16, 64)), zoo._hf_loss, "")
        ref = zoo.train(gpt2, steps=1)
        probe = memscale.dtr(None)
        zoo.train(gpt2, probe, steps=1)
        budget = zoo.budget_for(int(probe.summary()["peak_usage"]), 0.3, probe.summary().get("min_budget"))
        region = memscale.dtr(budget)
        got = zoo.train(gpt2, region, steps=1)
    finally:
        torch.set_num_threads(threads)
    s = region.summary()
    assert region.native
    assert not zoo.differences(ref, got), zoo.differences(ref, got)[:5]
    assert 0 < s["peak_usage"] <= budget
    assert s["parked"] > 0


def test_sparse_tensors_are_refused_with_memscales_error() -> None:
    """A sparse result, a sparse input an op is registered for, and one whose
    sparse kernel the region backend lacks: each refused with memscale's error
    naming the layout, as on the Python region (not the dispatcher's)."""
    x = torch.randn(4, 4)
    csr = torch.eye(4).to_sparse_csr()
    cases: list[tuple[str, Callable[[torch.Tensor], Any]]] = [
        ("torch.sparse_coo", lambda y: y.to_sparse()),
        ("torch.sparse_csr", lambda y: torch.sparse.sampled_addmm(csr, y, y)),
        ("torch.sparse_coo", lambda y: y + torch.eye(4).to_sparse()),
    ]
    for layout, op in cases:
        with pytest.raises(MemscaleError, match=layout):
            with memscale.dtr(None):
                op(x * 2)


@pytest.mark.parametrize(
    "op",
    [
        # A CUDA kernel of its own, none for the CPU: plain CPU tensors decompose
        # (the CPU has no _fused_rms_norm_backward).
        pytest.param(lambda x, w: torch.nn.functional.rms_norm(x, [x.shape[-1]], w), id="rms_norm"),
        # A CPU kernel of its own, none for CUDA: plain CPU tensors run it under its formula.
        pytest.param(lambda x, w: torch.nn.functional.channel_shuffle(x * w, 2), id="channel_shuffle"),
    ],
)
@pytest.mark.parametrize("setting", ["unbudgeted", "stress"])
def test_autograd_that_differs_by_device_follows_the_datas_device(op: Callable[..., Any], setting: str) -> None:
    """Ops whose autograd on plain tensors depends on the device (decomposed
    on one, a kernel and its formula on the other) record on the wrappers the
    graph plain tensors of the wrappers' device get, and train bitwise."""
    torch.manual_seed(0)
    x = torch.randn(2, 4, 3, 8, requires_grad=True)
    w = torch.randn(8, requires_grad=True)

    def step() -> tuple[str, list[torch.Tensor]]:
        x.grad = w.grad = None
        y = op(x * 1.5, w)
        name = type(y.grad_fn).__name__
        y.pow(2).sum().backward()
        return name, [y.detach(), x.grad, w.grad]

    plain_fn, plain = step()
    r = memscale.dtr(None) if setting == "unbudgeted" else memscale.dtr(stress=True)
    with r:
        got_fn, got = step()
    assert r.native
    assert got_fn == plain_fn
    assert _same(plain, got)


def test_factory_results_inside_an_entry_are_region_tensors() -> None:
    """Ops with no tensor argument (their BackendSelect kernel picks the
    backend from their options) make region tensors inside an entry, as the
    Python region's mode does; outside one, on the meta device and for
    uninitialized buffers (``torch.empty``), plain."""
    makers: list[Callable[[], torch.Tensor]] = [
        lambda: torch.zeros(3, 4),
        lambda: torch.ones(2, dtype=torch.float64),
        lambda: torch.full((2, 2), 7.0),
        lambda: torch.arange(6),
        lambda: torch.randn(4, generator=torch.Generator().manual_seed(0)),
        lambda: torch.zeros(5).add_(2.0),
        lambda: torch.eye(3),
    ]
    plain = [make() for make in makers]
    with memscale.dtr(None) as r:
        got = [make() for make in makers]
        assert all(is_region_tensor(t) for t in got)
        assert is_plain_tensor(torch.empty(2, device="meta"))
        assert is_plain_tensor(torch.empty(2))  # a buffer the program writes: left plain
    assert r.native
    assert all(is_plain_tensor(make()) for make in makers)
    assert _same(plain, got)


@pytest.mark.parametrize("setting", ["stress", "budget"])
def test_a_batch_drawn_inside_the_entry_is_rebuilt_bitwise(setting: str) -> None:
    """A batch drawn by torch.randn inside the step is the engine's to evict:
    rebuilt by drawing it again from the generator state it was drawn with."""
    model, _ = _mlp()

    def step() -> Any:
        model.zero_grad(set_to_none=True)
        x = torch.randn(16, 32)
        noise = torch.rand(16, 1)
        loss = (model(x) + noise).pow(2).mean()
        loss.backward()
        return loss.detach()

    probe = memscale.dtr(None)
    torch.manual_seed(11)
    with probe:
        step()
    regions = {
        "stress": lambda: memscale.dtr(stress=True),
        "budget": lambda: memscale.dtr(int(probe.summary()["peak_usage"] * 0.9), heuristic="lru"),
    }
    torch.manual_seed(11)
    plain = [step()] + [p.grad.clone() for p in model.parameters()]
    torch.manual_seed(11)
    r = regions[setting]()
    with r:
        loss = step()
    assert r.native
    assert _same(plain, [loss] + [p.grad for p in model.parameters()])
    assert r.summary()["rematerializations"] > 0


def test_an_out_op_that_resizes_a_region_tensor_is_refused_with_memscales_error() -> None:
    """The native region does not follow resizes of its own tensors: an out=
    op that resizes one is refused with memscale's error naming the shapes
    (the Python region refuses the growing ones the same way)."""
    with pytest.raises(MemscaleError, match=r"cat.out resized a region tensor in place from \[0\] to \[5\]"):
        with memscale.dtr(None):
            out = torch.zeros(0)
            torch.cat([torch.ones(2), torch.zeros(3)], out=out)
