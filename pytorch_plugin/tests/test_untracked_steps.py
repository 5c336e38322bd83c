"""Steps that fit the budget run untracked (memscale._dropin.fitting), through the drop-in API.

A step whose signature (module, grad mode, argument shapes) fitted the budget in
two tracked steps in a row runs as plain PyTorch: its values are bitwise a plain
run's, and a step with new shapes, or under a budget that forces evictions, is
tracked.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from _helpers import region_kind, require_engine

import memscale
from memscale import Config, MemscaleError
from memscale._dropin.fitting import CONFIRMATIONS, UNTRACKED_ENV, FitRecord, signature, untracked_steps_enabled
from memscale.errors import ConfigError

torch = pytest.importorskip("torch")
nn = torch.nn

require_engine()

#: Far above what the small MLP needs: every tracked step fits.
ROOMY = "1GiB"


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(UNTRACKED_ENV, raising=False)
    yield
    from memscale._dropin import attached

    for obj in list(attached.attached):
        try:
            memscale.detach(obj)
        except MemscaleError:
            pass


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 256), nn.Tanh(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))


def _train(model: nn.Module, batch_sizes: list[int]) -> tuple[list[float], list[str], dict[str, torch.Tensor]]:
    """Losses, each step's output's kind (``region_kind``), and the final parameters."""
    g = torch.Generator().manual_seed(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses, kinds = [], []
    for n in batch_sizes:
        x, y = torch.randn(n, 32, generator=g), torch.randint(0, 10, (n,), generator=g)
        opt.zero_grad()
        out = model(x)
        kinds.append(region_kind(out))
        loss = nn.functional.cross_entropy(out, y)
        loss.backward()
        losses.append(loss.item())
        opt.step()
    return losses, kinds, {k: v.detach().clone() for k, v in model.state_dict().items()}


def _assert_bitwise(a: tuple[Any, ...], b: tuple[Any, ...]) -> None:
    for step, (x, y) in enumerate(zip(a[0], b[0], strict=True)):
        assert x == y, f"step {step}: loss {y} != {x}"
    for name, value in a[2].items():
        assert torch.equal(value, b[2][name]), f"parameter {name} differs"


def test_fitting_steps_run_untracked_and_bitwise() -> None:
    sizes = [64] * 6
    plain = _train(_mlp(), sizes)
    model = memscale.wrap(_mlp(), Config(threshold=ROOMY))
    got = _train(model, sizes)
    _assert_bitwise(plain, got)
    summary = memscale.summary(model)
    assert summary.steps == 6
    assert summary.untracked_steps == 6 - CONFIRMATIONS
    assert got[1][:CONFIRMATIONS] == ["region"] * CONFIRMATIONS  # tracked
    assert got[1][CONFIRMATIONS:] == ["plain"] * (6 - CONFIRMATIONS)  # plain PyTorch
    assert f"({6 - CONFIRMATIONS} untracked" in str(summary)


def test_new_shapes_are_tracked_again() -> None:
    sizes = [64, 64, 64, 32, 32, 32, 64]
    plain = _train(_mlp(), sizes)
    model = memscale.wrap(_mlp(), Config(threshold=ROOMY))
    got = _train(model, sizes)
    _assert_bitwise(plain, got)
    assert got[1] == ["region", "region", "plain", "region", "region", "plain", "plain"]
    assert memscale.summary(model).untracked_steps == 3


def test_steps_that_evict_stay_tracked() -> None:
    sizes = [1024] * 4
    plain = _train(_mlp(), sizes)
    model = memscale.wrap(_mlp(), Config(mode="conservative"))  # 90 % of the baseline step's peak
    got = _train(model, sizes)
    _assert_bitwise(plain, got)
    summary = memscale.summary(model)
    assert summary.evictions > 0
    assert summary.untracked_steps == 0
    assert got[1][-1] == "region"


@pytest.mark.parametrize(
    ("config", "env"),
    [(Config(threshold=ROOMY, untracked_steps=False), None), (Config(threshold=ROOMY), "0")],
    ids=["config", "env"],
)
def test_untracked_steps_can_be_turned_off(
    config: Config, env: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if env is not None:
        monkeypatch.setenv(UNTRACKED_ENV, env)
    model = memscale.wrap(_mlp(), config)
    _, kinds, _ = _train(model, [64] * 4)
    assert kinds == ["region"] * 4
    assert memscale.summary(model).untracked_steps == 0


@pytest.mark.parametrize(
    ("setting", "env", "expected"),
    [(None, None, True), (None, "1", True), (None, " 0 ", False), (True, "0", True), (False, "1", False)],
)
def test_untracked_steps_setting(
    setting: bool | None, env: str | None, expected: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if env is not None:
        monkeypatch.setenv(UNTRACKED_ENV, env)
    assert untracked_steps_enabled(setting) is expected


@pytest.mark.parametrize("bad", ["yes", "2", "off", "true"])
def test_a_malformed_setting_is_refused(bad: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(UNTRACKED_ENV, bad)
    with pytest.raises(ConfigError, match=rf"{UNTRACKED_ENV}={bad!r}.*expected 1"):
        untracked_steps_enabled(None)
    with pytest.raises(ConfigError, match="untracked_steps"):
        Config(untracked_steps="yes")  # type: ignore[arg-type]


FIT = {"budget": 100, "peak_usage": 100, "evictions": 0, "swaps_out": 0, "rematerializations": 0}


@pytest.mark.parametrize(
    ("steps", "untracked"),
    [
        ([(FIT, True)] * CONFIRMATIONS, True),
        ([(FIT, True)] * (CONFIRMATIONS - 1), False),
        ([(FIT, True), ({**FIT, "evictions": 1}, True), (FIT, True)], False),  # a run must be consecutive
        ([(FIT, True), (FIT, False)], False),  # the step raised
        ([(FIT, True), ({**FIT, "peak_usage": 101}, True)], False),  # over the budget
        ([(FIT, True), ({**FIT, "swaps_out": 2}, True)], False),
        ([(FIT, True), ({**FIT, "budget": 0}, True)], False),  # unbudgeted
        ([({}, False), (FIT, True), (FIT, True)], True),
    ],
)
def test_fit_record(steps: list[tuple[dict[str, int], bool]], untracked: bool) -> None:
    record = FitRecord(enabled=True)
    for last, ok in steps:
        record.tracked("sig", last, ok)
    assert record.runs_untracked("sig") is untracked
    assert not record.runs_untracked("other")
    assert not record.runs_untracked(None)
    assert not FitRecord(enabled=False).runs_untracked("sig")


@pytest.mark.parametrize(
    ("peak", "device_bytes", "untracked"),
    [(100, None, True), (100, 1000, True), (95, 100, True), (96, 100, False), (100, 100, False)],
)
def test_on_a_gpu_a_fit_leaves_headroom_below_the_cards_size(peak: int, device_bytes: int | None, untracked: bool) -> None:
    record = FitRecord(enabled=True)
    for _ in range(CONFIRMATIONS):
        record.tracked("sig", {**FIT, "peak_usage": peak}, True, device_bytes=device_bytes)
    assert record.runs_untracked("sig") is untracked


def test_an_untracked_step_over_the_budget_tracks_its_shapes_again(caplog: pytest.LogCaptureFixture) -> None:
    record = FitRecord(enabled=True)
    for _ in range(CONFIRMATIONS):
        record.tracked("sig", FIT, True)
    record.ran_untracked("sig", None, 100)  # not measured (CPU): nothing to go on
    record.ran_untracked("sig", 100, 100)
    assert record.runs_untracked("sig")
    with caplog.at_level(logging.WARNING, logger="memscale"):
        record.ran_untracked("sig", 101, 100)
    assert "over the budget" in caplog.text and "MEMSCALE_UNTRACKED_STEPS=0" in caplog.text
    assert not record.runs_untracked("sig")
    record.tracked("sig", FIT, True)
    record.tracked("sig", FIT, True)
    assert not record.runs_untracked("sig")  # for good
    assert (record.untracked, record.over_budget) == (3, 1)


def test_an_untracked_step_that_raised_is_followed_by_tracked_ones() -> None:
    record = FitRecord(enabled=True)
    for _ in range(CONFIRMATIONS):
        record.tracked("sig", FIT, True)
    record.ran_untracked("sig", None, 100, ok=False)  # e.g. torch.OutOfMemoryError
    assert not record.runs_untracked("sig")
    for _ in range(CONFIRMATIONS):
        record.tracked("sig", FIT, True)
    assert record.runs_untracked("sig")


def test_signature() -> None:
    m, other = nn.Linear(2, 2), nn.Linear(2, 2)
    x = torch.zeros(4, 2)
    same = signature(m, (torch.ones(4, 2),))
    assert signature(m, (x,)) == same
    differing = [
        signature(other, (x,)),
        signature(m, (torch.zeros(5, 2),)),
        signature(m, (x.double(),)),
        signature(m, (x.requires_grad_(True),)),
        signature(m, (torch.zeros(4, 2), 3)),
        signature(m, ({"input": torch.zeros(4, 2)},)),
    ]
    assert all(s != same for s in differing)
    assert signature(m, (torch.zeros(4, 2), 3)) != signature(m, (torch.zeros(4, 2), 4))
    with torch.no_grad():
        assert signature(m, (torch.zeros(4, 2),)) != same


def test_signature_sees_into_mappings_and_refuses_what_it_cannot_see() -> None:
    from collections import UserDict

    m = nn.Linear(2, 2)

    def batch(n: int) -> Any:  # as Hugging Face's BatchEncoding, a Mapping that is no dict
        return UserDict({"input_ids": torch.zeros(4, n), "flags": [True, {"p": 0.1}]})

    assert signature(m, ((), batch(8))) == signature(m, ((), batch(8)))
    assert signature(m, ((), batch(8))) != signature(m, ((), batch(9)))
    assert signature(m, ((torch.float16, torch.device("cpu")), {})) is not None

    class Batch:
        def __init__(self) -> None:
            self.x = torch.zeros(4, 2)

    assert signature(m, ((Batch(),), {})) is None  # its tensors cannot be seen: always tracked
    assert signature(m, (({(1, 2): torch.zeros(1)}),)) is not None
    nested: list[Any] = []
    nested.append(nested)
    assert signature(m, (nested,)) is None


def test_the_peak_probe_reads_the_allocators_watermark(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the simulated device 0, standing for a GPU with the memscale allocator."""
    from memscale._native import lib as _lib
    from memscale._allocator import install as allocator
    from memscale._allocator.peak import PeakProbe

    assert PeakProbe().close() is None  # the CPU: nothing to read
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(allocator, "installed", lambda: object())
    lib = _lib.lib()
    before = lib.memscale_allocated(0)
    probe = PeakProbe()
    nbytes = 6 << 20
    ptr = lib.memscale_malloc(nbytes, 0, None)
    assert ptr, _lib.last_error()
    lib.memscale_free(ptr, nbytes, 0, None)
    peak = probe.close()
    assert peak is not None and peak >= before + nbytes
    assert probe.close() is None  # closed once


def _train_accumulating(model: nn.Module, steps: list[list[int]]) -> tuple[list[float], list[list[str]], dict[str, torch.Tensor]]:
    """Each step runs a forward per micro-batch of the given sizes and one
    backward of their summed losses (a step ends with its backward pass: a
    backward per micro-batch would make each a step of its own)."""
    g = torch.Generator().manual_seed(2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses, kinds = [], []
    for sizes in steps:
        opt.zero_grad()
        step_kinds = []
        total = 0
        for n in sizes:
            x, y = torch.randn(n, 32, generator=g), torch.randint(0, 10, (n,), generator=g)
            out = model(x)
            step_kinds.append(region_kind(out))
            total = total + nn.functional.cross_entropy(out, y) / len(sizes)
        total.backward()
        losses.append(total.item())
        kinds.append(step_kinds)
        opt.step()
    return losses, kinds, {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_accumulation_meeting_other_shapes_is_tracked_from_that_forward() -> None:
    steps = [[64, 64], [64, 64], [64, 64], [64, 32], [64, 64], [64, 64], [64, 64], [64, 64, 64]]
    plain = _train_accumulating(_mlp(), steps)
    model = memscale.wrap(_mlp(), Config(threshold=ROOMY))
    got = _train_accumulating(model, steps)
    _assert_bitwise(plain, got)
    tracked, untracked = ["region"] * 2, ["plain"] * 2
    assert got[1] == [
        tracked,
        tracked,
        untracked,
        ["plain", "region"],  # the 32-row micro-batch: tracked from there
        tracked,  # the shapes fit twice again before running untracked
        tracked,
        untracked,
        ["plain", "plain", "region"],  # a third forward the fits did not have
    ]
    summary = memscale.summary(model)
    assert (summary.untracked_steps, summary.untracked_promoted) == (2, 2)
    assert "2 more tracked from a forward" in str(summary)


def test_a_run_of_fits_has_the_same_forwards() -> None:
    record = FitRecord(enabled=True)
    record.tracked("s", FIT, True, forwards=["s", "a"])
    record.tracked("s", FIT, True, forwards=["s", "b"])
    assert not record.runs_untracked("s")  # the second fit's forwards were not the first's
    record.tracked("s", FIT, True, forwards=["s", "b"])
    assert record.runs_untracked("s")
    assert record.follows("s", ["s"]) and record.follows("s", ["s", "b"])
    assert not record.follows("s", ["s", "a"]) and not record.follows("s", ["s", "b", "b"])
    assert not record.follows("s", ["s", None])
    record.promote("s")
    assert not record.runs_untracked("s") and record.promoted == 1
    for _ in range(CONFIRMATIONS):
        record.tracked("s", FIT, True, forwards=["s", None])  # an opaque later forward
    assert not record.runs_untracked("s")


class _WrappedStep:
    """What ``zoo.Trainer.step`` enters for a model hooked by ``memscale.wrap``:
    the step ends where the trainer's region would be left."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def __enter__(self) -> _WrappedStep:
        return self

    def __exit__(self, *exc: object) -> None:
        memscale.end_step(self.model)

    def last_summary(self) -> dict[str, Any]:
        return {}


def _zoo_names() -> list[str]:
    import zoo

    return list(zoo.MODELS)


@pytest.mark.parametrize("name", _zoo_names())
def test_every_zoo_family_runs_its_fitting_steps_untracked_and_bitwise(name: str) -> None:
    import zoo

    family = zoo.MODELS[name]()
    steps = 4
    ref = zoo.train(family, steps=steps)
    trainer = zoo.Trainer.of(family)
    memscale.wrap(trainer.model, Config(threshold=ROOMY, log_summary=False))
    got = [trainer.step(_WrappedStep(trainer.model)) for _ in range(steps)]
    summary = memscale.summary(trainer.model)
    assert zoo.differences(ref, got) == []
    # The GAN's step calls its generator and discriminator, not the wrapped
    # module: its steps open at the generator, a child of the wrapped module.
    # Its two backward passes end two steps (the second opens at the
    # discriminator), each with a signature of its own.
    passes = 2 if name == "gan" else 1
    assert (summary.steps, summary.untracked_steps, summary.untracked_promoted) == (
        passes * steps, passes * (steps - CONFIRMATIONS), 0
    )


def test_a_dead_modules_signatures_are_forgotten() -> None:
    import gc

    record = FitRecord(enabled=True)
    m = nn.Linear(2, 2)
    sig = signature(m, (torch.zeros(1, 2),))
    record.watch(m)
    record.watch(m)  # once
    for _ in range(CONFIRMATIONS):
        record.tracked(sig, FIT, True)
    assert record.runs_untracked(sig)
    del m
    gc.collect()
    assert not record.runs_untracked(sig)  # a new module at the same address is another model


def test_an_untracked_step_measured_over_the_budget_is_tracked_again(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Through wrap's steps: a probe (a GPU's watermark, faked) reporting more
    than the budget makes the next steps of those shapes tracked, for good."""
    from memscale._dropin import steps as _steps

    class OverBudget:
        def close(self) -> int:
            return 2 << 30  # above the 1 GiB threshold

    monkeypatch.setattr(_steps, "PeakProbe", OverBudget)
    model = memscale.wrap(_mlp(), Config(threshold=ROOMY))
    with caplog.at_level(logging.WARNING, logger="memscale"):
        _, kinds, _ = _train(model, [64] * 6)
    assert kinds == ["region", "region", "plain", "region", "region", "region"]
    summary = memscale.summary(model)
    assert (summary.untracked_steps, summary.untracked_over_budget) == (1, 1)
    assert summary.peak_usage == 2 << 30
    assert "over the budget" in caplog.text
    assert "1 over budget" in str(summary)


def test_untracked_steps_end_at_a_step_boundary(monkeypatch: pytest.MonkeyPatch) -> None:
    # An untracked step opens no region, so the drop-in tells the allocator
    # itself that the step ended: every step, tracked or not, is one boundary.
    from memscale._dropin import steps

    told: list[int | None] = []
    monkeypatch.setattr(steps, "step_boundary", told.append)
    monkeypatch.setattr(steps, "_cuda_device", lambda: 0)
    model = memscale.wrap(_mlp(), Config(threshold=ROOMY))
    _, kinds, _ = _train(model, [16] * 5)
    untracked = sum(kind == "plain" for kind in kinds)
    assert untracked >= 2, kinds
    assert told == [0] * untracked
