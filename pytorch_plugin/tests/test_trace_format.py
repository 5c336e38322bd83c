"""DTR trace recording (memscale.trace): the format is self-consistent.

A recorded training step must parse line by line in the DTR trace format
(REFERENCE.md section 6): START first, every name defined before use and not
used after release, MEMORY (and ALIAS for results) right after each CONSTANT
and CALL result, ALIAS and MUTATE indexing ARGS, a BACKWARD annotation, and an
unbudgeted replay whose peak is the recording region's. The committed sample
traces (samples/traces/*.log.gz) pass the same checks. Whether the Go parser
reads them is tested on the Go side.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any

import pytest
from _helpers import python_region_only

from memscale import MemscaleError

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")

try:
    from memscale import trace
    from memscale._native import engine as _engine

    _engine.dtr_lib()
except (ImportError, MemscaleError) as exc:  # pragma: no cover - without the engine
    pytest.skip(f"the DTR engine is unavailable: {exc}", allow_module_level=True)

SAMPLES = Path(__file__).resolve().parents[2] / "samples" / "traces"


def _lines(path: Path) -> list[dict[str, Any]]:
    return list(trace.read(path))


def _record_cnn(path: Path) -> trace.TraceRecorder:
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(inplace=True),
        torch.nn.Dropout(0.2),
        torch.nn.Flatten(),
        torch.nn.Linear(8 * 8 * 8, 10),
    )
    x = torch.randn(4, 3, 8, 8)
    rec = trace.record(path)
    with rec:
        loss = torch.nn.functional.cross_entropy(net(x), torch.tensor([1, 2, 3, 4]))
        loss.backward()
    return rec


@python_region_only("trace recording (memscale record)")
def test_recorded_step_is_self_consistent(tmp_path: Path) -> None:
    path = tmp_path / "cnn.log"
    rec = _record_cnn(path)
    lines = _lines(path)
    assert lines[0] == {"ANNOTATION": "START", "INSTRUCTION": "ANNOTATE"}
    kinds = [o["INSTRUCTION"] for o in lines]
    assert rec.lines == len(lines)
    calls = [o for o in lines if o["INSTRUCTION"] == "CALL"]
    results = sum(len(o["RESULT"]) for o in calls)
    assert kinds.count("ALIAS") == results
    assert kinds.count("MEMORY") == results + kinds.count("CONSTANT")
    for kind in ("CONSTANT", "CALL", "MUTATE", "COPY", "RELEASE"):
        assert kind in kinds, f"no {kind} line"
    # in-place ReLU, dropout's bernoulli_ and BatchNorm's counter are MUTATEs
    mutated = {o["NAME"] for o in lines if o["INSTRUCTION"] == "MUTATE"}
    assert {"relu_", "bernoulli_.float"} <= mutated, mutated
    names = {o["NAME"] for o in calls}
    assert {"convolution", "native_batch_norm", "convolution_backward"} <= names, names
    for o in calls:
        assert int(o["TIME"]) >= 0
        assert all(isinstance(a, str) for a in o["ARGS"])
    backward = kinds.index("ANNOTATE", 1)
    assert lines[backward]["ANNOTATION"] == "BACKWARD"
    first_bwd_op = next(i for i, o in enumerate(lines) if o.get("NAME") == "convolution_backward")
    assert first_bwd_op > backward > kinds.index("CALL")
    summary = trace.check(path)
    assert summary.has_backward
    assert summary.compute_ns > 0
    assert summary.outputs > 0
    # the unbudgeted replay of the trace peaks where the recording region did
    assert summary.peak_bytes == rec.region.summary()["peak_usage"]


@python_region_only("trace recording (memscale record)")
def test_lines_have_the_reference_shape(tmp_path: Path) -> None:
    path = tmp_path / "cnn.log.gz"
    _record_cnn(path)
    with gzip.open(path, "rt") as f:
        raw = [line.rstrip("\n") for line in f]
    for line in raw:
        obj = json.loads(line)
        # keys sorted, no spaces: byte-compatible with the DTR authors' logs
        assert line == json.dumps(obj, sort_keys=True, separators=(",", ":"))
        kind = obj["INSTRUCTION"]
        if kind in ("MEMORY", "ALIAS"):
            assert isinstance(obj[kind], str) and obj[kind].lstrip("-").isdigit()
        if kind in ("CALL", "MUTATE"):
            assert isinstance(obj["TIME"], str) and obj["TIME"].isdigit()
        if kind == "MUTATE":
            assert all(isinstance(m, int) for m in obj["MUTATE"])


@python_region_only("trace recording (memscale record)")
def test_gpt2_step_records_and_replays(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg)
    ids = torch.randint(0, 64, (2, 16))
    path = tmp_path / "gpt2.log"
    with trace.record(path) as rec:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
    summary = trace.check(path)
    assert summary.has_backward
    assert summary.instructions["CALL"] > 100
    assert summary.peak_bytes == rec.region.summary()["peak_usage"]
    # parameters are constants; their gradients and the loss are outputs
    n_params = len(list(model.parameters()))
    assert summary.outputs >= 2 * n_params


@pytest.mark.parametrize("name", ["gpt2-small.log.gz", "bert-small.log.gz"])
def test_committed_sample_traces(name: str) -> None:
    path = SAMPLES / name
    assert path.is_file(), f"{path} is missing (python -m memscale.trace --model ... --out {path})"
    assert path.stat().st_size < 2 * 1024 * 1024
    summary = trace.check(path)
    assert summary.has_backward
    for kind in ("CONSTANT", "CALL", "MUTATE", "COPY", "RELEASE"):
        assert summary.instructions.get(kind, 0) > 0, kind
    assert summary.peak_bytes > summary.constants_bytes > 0
    assert summary.compute_ns > 0


def test_shared_reference_traces_parse_with_the_same_checker() -> None:
    shared = Path(__file__).resolve().parents[3] / "shared" / "traces" / "dtr"
    logs = sorted(shared.glob("*.log")) if shared.is_dir() else []
    if not logs:
        pytest.skip(f"no shared DTR traces in {shared}")
    summary = trace.check(min(logs, key=lambda p: p.stat().st_size))
    assert summary.has_backward and summary.instructions["CALL"] > 0


@pytest.mark.parametrize(
    ("lines", "match"),
    [
        (['{"INSTRUCTION":"CALL","NAME":"x"}'], "no ANNOTATE START"),
        (['{"ANNOTATION":"START","INSTRUCTION":"ANNOTATE"}', '{"ARGS":["a"],"INSTRUCTION":"CALL","NAME":"f","RESULT":["b"],"TIME":"1"}'], "'a' is used but not defined"),
        (['{"ANNOTATION":"START","INSTRUCTION":"ANNOTATE"}', '{"INSTRUCTION":"CONSTANT","NAME":"a"}', '{"INSTRUCTION":"RELEASE","NAME":"a"}'], "expected MEMORY"),
        (['{"ANNOTATION":"START","INSTRUCTION":"ANNOTATE"}', '{"INSTRUCTION":"CONSTANT","NAME":"a"}', '{"INSTRUCTION":"MEMORY","MEMORY":"4","NAME":"a"}', '{"ARGS":["a"],"INSTRUCTION":"CALL","NAME":"f","RESULT":["b"],"TIME":"1"}', '{"INSTRUCTION":"MEMORY","MEMORY":"4","NAME":"b"}', '{"ALIAS":"3","INSTRUCTION":"ALIAS","NAME":"b"}'], "outside ARGS"),
        (['{"ANNOTATION":"START","INSTRUCTION":"ANNOTATE"}', '{"INSTRUCTION":"CONSTANT","NAME":"a"}', '{"INSTRUCTION":"MEMORY","MEMORY":"4","NAME":"a"}', '{"ARGS":["a"],"INSTRUCTION":"MUTATE","MUTATE":[1],"NAME":"f_","TIME":"1"}'], "MUTATE index"),
        (['{"ANNOTATION":"START","INSTRUCTION":"ANNOTATE"}', '{"INSTRUCTION":"CONSTANT","NAME":"a"}', '{"INSTRUCTION":"MEMORY","MEMORY":"-4","NAME":"a"}'], "below 0"),
        (['{"ANNOTATION":"START","INSTRUCTION":"ANNOTATE"}', '{"INSTRUCTION":"JUMP"}'], "unknown instruction"),
        (['{"ANNOTATION":"START","INSTRUCTION":"ANNOTATE"}', "not json"], "not JSON"),
    ],
)
def test_check_names_the_bad_line(tmp_path: Path, lines: list[str], match: str) -> None:
    path = tmp_path / "bad.log"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(trace.TraceError, match=match):
        trace.check(path)
