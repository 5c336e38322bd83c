"""memscale.plan (issue 31): a step recorded on meta and on the CPU, planned
by the native command; the cost model's device table equals the Go one."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch

import memscale
from _helpers import python_region_only
from memscale._cli import native_command
from memscale._plan.costs import DEVICES, lookup_device
from memscale._plan.record import resize_batch

pytestmark = pytest.mark.skipif(native_command() is None, reason="build/memscale not built (make cli)")
#: plan() records the step (memscale record), which the native region refuses.
RECORDING = python_region_only("trace recording (memscale record), which plan() runs")


def _mlp() -> tuple[torch.nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    return model, (torch.randn(32, 64), torch.randint(0, 10, (32,)))


@RECORDING
def test_plan_on_meta_with_budgets_devices_and_batches(tmp_path) -> None:
    model, batch = _mlp()
    opt = torch.optim.Adam(model.parameters())
    p = memscale.plan(model, batch, opt, torch.nn.functional.cross_entropy, device="meta", budgets=["300KB", "1GiB"],
                      active="1GiB", target=["l4"], batch_sizes=[16, 32], out=tmp_path)
    assert next(model.parameters()).device.type == "cpu"  # the user's model is left alone
    plans = p.report["plans"]
    assert [q["model"]["batch_size"] for q in plans] == [16, 32]
    params = sum(t.numel() * 4 for t in model.parameters())
    for q in plans:
        m = q["memory"]
        assert q["model"]["parameters_bytes"] == params
        # Adam: exp_avg and exp_avg_sq, and a step scalar per parameter
        assert 2 * params <= q["model"]["optimizer_state_bytes"] <= 2 * params + 8 * 6
        assert m["peak_bytes"] >= m["trace_peak_bytes"]
        assert m["arena_bytes"] >= m["aligned_peak_bytes"]
        assert "estimated for L4" in q["model"]["costs"]
        assert all("violates_300KB" in v["violates"] for v in q["variants"])
        assert q["active_budget"]["profile"] == "safe"
    assert p.report["batches"][0]["largest_native"] == 32
    assert "largest batch" in p.text and "summary:" in p.text
    assert p.plot_path is not None and p.plot_path.stat().st_size > 1000


@RECORDING
def test_plan_measured_on_cpu(tmp_path) -> None:
    model, batch = _mlp()
    p = memscale.plan(model, batch, loss_fn=torch.nn.functional.cross_entropy, out=tmp_path, plot=False)
    q = p.plans[0]
    assert q["model"]["costs"] == "measured on cpu"
    assert q["memory"]["min_feasible_budget_bytes"] <= q["memory"]["peak_bytes"]
    assert q["step_ns"] > 0


def test_bad_arguments_are_one_line() -> None:
    model, batch = _mlp()
    with pytest.raises(memscale.MemscaleError, match=r"unknown device 'v100' \(known: a100-40gb"):
        memscale.plan(model, batch, target="v100")
    with pytest.raises(memscale.MemscaleError, match=r'--budgets: "24XB".*want sizes such as 24GiB'):
        memscale.plan(model, batch, loss_fn=torch.nn.functional.cross_entropy, device="meta", budgets=["24XB"], plot=False)
    with pytest.raises(memscale.MemscaleError, match=r"--overhead-limit"):
        memscale.plan(model, batch, loss_fn=torch.nn.functional.cross_entropy, device="meta", overhead_limit=0.5, plot=False)
    with pytest.raises(memscale.MemscaleError, match=r"repeats=0"):
        memscale.plan(model, batch, loss_fn=torch.nn.functional.cross_entropy, repeats=0, plot=False)


def test_device_tables_agree() -> None:
    out = subprocess.run([str(native_command()), "plan", "--list-devices", "--json", "-"], capture_output=True, text=True, check=True)
    go = {d["key"]: d for d in json.loads(out.stdout)}
    assert set(go) == set(DEVICES)
    for key, d in DEVICES.items():
        g = go[key]
        assert (g["memory_bytes"], g["bf16_flops"], g["fp32_flops"], g["bandwidth_bytes_per_s"]) == (
            d.memory_bytes, d.bf16_flops, d.fp32_flops, d.bandwidth_bytes_per_s), key
    assert lookup_device("A100").key == "a100-80gb"


def test_resize_batch() -> None:
    b = {"ids": torch.arange(6).view(3, 2), "n": 3}
    r = resize_batch(b, 5)
    assert r["ids"].shape == (5, 2) and r["n"] == 3
    assert r["ids"][3].tolist() == [0, 1]


def test_cost_model_views_cost_no_kernel() -> None:
    """A view (declared in its schema, or _unsafe_view) is metadata: no kernel and
    no bytes; a copy moves its bytes; an in-place op writes what it returns. At the
    dispatch level a view's _base is not set, which made views cost their bytes."""
    from memscale._plan.costs import LAUNCH_NS, VIEW_NS, CostModel

    model = CostModel(lookup_device("h100"))
    aten = torch.ops.aten
    x = torch.empty(1024, 1024, device="meta")  # 4 MiB

    def cost(func, *args):
        return model.op_ns(func, args, {}, func(*args))

    assert cost(aten.view.default, x, [1024 * 1024]) == VIEW_NS
    assert cost(aten.t.default, x) == VIEW_NS
    assert cost(aten._unsafe_view.default, x, [1024 * 1024]) == VIEW_NS
    assert cost(aten.split.Tensor, x, 256) == VIEW_NS
    bw = model.gpu.bandwidth_bytes_per_s * 0.8
    copy = cost(aten.clone.default, x)
    assert copy == int(2 * 4 * 2**20 / bw * 1e9) + LAUNCH_NS  # read and write 4 MiB
    inplace = cost(aten.mul_.Tensor, torch.empty_like(x), x)
    assert inplace == int(3 * 4 * 2**20 / bw * 1e9) + LAUNCH_NS  # read both, write self


@RECORDING
def test_meta_value_read_names_the_way_out(tmp_path) -> None:
    """A step that reads a value on meta (transformers' packed-sequence check when the
    batch has no attention_mask and use_cache is off) fails in one line naming the way
    out; with a mask and eager attention the same model plans."""
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    cfg = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, n_positions=16, vocab_size=64, use_cache=False,
                                  attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg)
    ids = torch.randint(0, 64, (2, 16))
    with pytest.raises(memscale.MemscaleError, match="Pass an attention_mask .torch.ones like input_ids. with attn_implementation='eager'"):
        memscale.plan(model, {"input_ids": ids, "labels": ids}, device="meta", out=tmp_path / "a", plot=False)
    p = memscale.plan(model, {"input_ids": ids, "labels": ids, "attention_mask": torch.ones_like(ids)}, device="meta",
                      out=tmp_path / "b", ratios="0.5", plot=False)
    assert p.plans[0]["memory"]["peak_bytes"] > 0


def _region_floor(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> int:
    """The region's ``min_budget`` of one unbudgeted step: what is pinned (parameters,
    inputs, the gradients it pins), what it never evicts, and the largest op."""
    region = memscale.dtr(budget=None)
    with region:
        torch.nn.functional.cross_entropy(model(batch[0]), batch[1]).backward()
    model.zero_grad(set_to_none=True)
    return int(region.last_summary()["min_budget"])


@RECORDING
@pytest.mark.parametrize("device", [None, "meta"])
def test_plan_lower_bound_is_the_regions(tmp_path, device) -> None:
    """The planner replays the step as the region runs it: the gradients the region
    pins stay pinned (the trace has no line for a pin: the recorder writes them
    beside it) and what is under the region's minimum evictee size is never
    evicted, so its lower bound is the region's min_budget byte for byte. Before,
    the replay could evict gradients: 10.52 MB against the region's 15.80 MB for the
    MLP of bench/planner_bench.py at batch 512."""
    model, batch = _mlp()
    opt = torch.optim.Adam(model.parameters())
    p = memscale.plan(model, batch, opt, torch.nn.functional.cross_entropy, device=device, ratios="0.5", out=tmp_path,
                      plot=False)
    q = p.plans[0]
    info = json.loads((tmp_path / "step-b32.log.gz.info.json").read_text())
    assert len(info["pins"]) == sum(1 for t in model.parameters() if t.requires_grad)  # one gradient each
    floor = _region_floor(model, batch)
    assert q["memory"]["min_budget_lower_bound_bytes"] - q["model"]["optimizer_state_bytes"] == floor


@RECORDING
def test_plan_and_region_refuse_the_same_budget(tmp_path) -> None:
    """Below the region's floor both refuse: the planner's replay runs out of memory
    (status "oom", whatever the op costs) and memscale.dtr raises. Just above the
    planner's old floor (the gradients evictable), which the region refuses."""
    model, batch = _mlp()
    p = memscale.plan(model, batch, loss_fn=torch.nn.functional.cross_entropy, out=tmp_path, plot=False)
    floor = _region_floor(model, batch)
    grads = sum(t.numel() * t.element_size() for t in model.parameters())
    budget = floor - grads // 2
    q = memscale.plan(model, batch, loss_fn=torch.nn.functional.cross_entropy, out=tmp_path / "b", plot=False,
                      budgets=[f"{budget}B"]).plans[0]
    assert q["budgets"][0]["dtr_status"] == "oom"
    region = memscale.dtr(budget=budget)
    with pytest.raises(memscale.MemscaleError):
        with region:
            torch.nn.functional.cross_entropy(model(batch[0]), batch[1]).backward()
    model.zero_grad(set_to_none=True)
    assert p.plans[0]["memory"]["min_budget_lower_bound_bytes"] == floor


def test_median_costs() -> None:
    """repeats: each op's time is its median over the recordings; a recording of
    another program is left out."""
    from memscale._plan.record import median_costs

    def rec(*times: int, name: str = "mm") -> list[dict[str, object]]:
        return [{"INSTRUCTION": "CALL", "NAME": name, "ARGS": [], "RESULT": [f"x{i}"], "TIME": str(t)}
                for i, t in enumerate(times)]

    runs = [rec(10, 100), rec(30, 50), rec(20, 70), rec(1, 1, name="add")]
    median_costs(runs)
    assert [r["TIME"] for r in runs[0]] == ["20", "70"]
    lone = [rec(10), rec(30, 40)]
    median_costs(lone)
    assert lone[0][0]["TIME"] == "10"
