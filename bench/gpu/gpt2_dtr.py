"""GPT-2 training on a GPU: native allocator vs memscale + DTR.

Driver (the default; every measurement runs in its own subprocess of this
script, because PyTorch accepts a pluggable allocator only once per process and
only before CUDA is initialized):

(a) ``--worker native``: PyTorch's own allocator. GPT-2 (transformers
    ``GPT2Config``, random weights; 12 layers, width 768, sequence 512, batch 8
    by default; dropout off, eager attention, deterministic algorithms) trains
    ``--warmup + --steps`` steps (forward, backward, plain SGD). Reports the
    median step time of the measured steps (``torch.cuda.synchronize`` around
    each), ``torch.cuda.max_memory_allocated`` over all steps, and saves the
    gradients of step 0 for (b).
(b) ``--worker dtr``: ``memscale.install()`` then every step's forward and
    backward inside ``memscale.dtr(budget=X)``, X = ``--fraction`` (0.5) x the
    native peak of (a). Reports whether step 0's loss and gradients equal the
    native ones (bitwise, and max abs difference), ``memscale.max_memory_allocated()``
    against the budget plus the largest single op output (the logits), the
    step-time ratio to (a), and the evictions / rematerializations of
    ``region.summary()``.
(c) The largest batch that fits: a search over the batch size (grow by a
    factor until a probe fails, then bisect to within 5 %, at most
    ``--max-probes`` probes and within the time budget) with
    ``--worker probe-native`` (OOM = does not fit) starting at a batch predicted
    from (a), and with ``--worker probe-memscale`` (``memscale.install(threshold=
    "95%")``, ``dtr(budget=that threshold)``) starting at twice the native result.
    A probe fits if it completes its training steps (2 native, 1 memscale by
    default) without an error within its time limit.

The driver writes ``gpt2_dtr.json`` (everything) into ``--out-dir`` and each
worker its own JSON there; large files (the gradients) go to ``--work``. It
stops starting subprocesses when ``--time-budget`` seconds are used up.

``--device cpu`` (with a tiny ``--layers/--width/--seq/--vocab``) runs the same
plumbing on the CPU for testing without a GPU: the native "peak" is then the
engine-counted peak of an unbudgeted region step, and memscale probes use
``--cpu-fit-budget`` bytes. Without a GPU and without ``--device cpu`` the
script prints a skip message and exits 0.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import Any

import _common

STEP = "gpt2_dtr"


# --------------------------------------------------------------------------- arguments


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", choices=("native", "dtr", "probe-native", "probe-memscale"), help="internal: run one measurement")
    p.add_argument("--result", help="worker: JSON result file")
    p.add_argument("--out-dir", default=".", help="driver: directory for the JSON results (default .)")
    p.add_argument("--work", default=None, help="driver: directory for large files (default $TMPDIR/memscale-gpt2-work)")
    p.add_argument("--time-budget", type=float, default=420.0, help="driver: seconds for all subprocesses (default 420)")
    p.add_argument("--skip-fit", action="store_true", help="driver: skip (c), the largest-batch search")
    p.add_argument("--dry-run", action="store_true", help="check imports and print the plan; touch no GPU")
    # model and run
    p.add_argument("--impl", choices=("auto", "hf", "mini"), default="auto", help="transformers GPT-2 (hf), the built-in copy (mini); auto: hf if importable")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--width", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--batch", type=int, default=8, help="batch of (a) and (b) (default 8)")
    p.add_argument("--dropout", type=float, default=0.0, help="dropout probability (default 0: off)")
    p.add_argument("--attn", default="eager", help="transformers attention implementation (default eager)")
    p.add_argument("--steps", type=int, default=5, help="measured steps (default 5)")
    p.add_argument("--warmup", type=int, default=2, help="warm-up steps before the measured ones (default 2)")
    p.add_argument("--no-deterministic", action="store_true", help="do not call torch.use_deterministic_algorithms(True)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    # (b)
    p.add_argument("--fraction", type=float, default=0.5, help="DTR budget as a fraction of the native peak (default 0.5)")
    p.add_argument("--budget", type=int, default=None, help="worker dtr: budget in bytes")
    p.add_argument("--ref-grads", help="worker dtr: the native run's step-0 gradients (.pt)")
    p.add_argument("--save-grads", help="worker native: where to save step-0 gradients (.pt)")
    p.add_argument("--heuristic", default=None, help="DTR heuristic (default: the engine's)")
    # (c)
    p.add_argument("--fit-threshold", default="95%", help="memscale.install(threshold=...) for the memscale probes (default 95%%)")
    p.add_argument("--cpu-fit-budget", type=int, default=64 << 20, help="--device cpu: DTR budget of memscale probes in bytes")
    p.add_argument("--max-probes", type=int, default=6, help="probes per search at most (default 6)")
    p.add_argument("--max-batch", type=int, default=4096, help="largest batch a search tries (default 4096)")
    p.add_argument("--probe-steps-native", type=int, default=2)
    p.add_argument("--probe-steps-memscale", type=int, default=1)
    p.add_argument("--probe-timeout-native", type=float, default=90.0)
    p.add_argument("--probe-timeout-memscale", type=float, default=180.0)
    a = p.parse_args(argv)
    if a.width % a.heads:
        p.error(f"--width {a.width} must be divisible by --heads {a.heads}")
    if not 0 < a.fraction <= 1:
        p.error(f"--fraction {a.fraction}: must be in (0, 1]")
    if a.steps < 1 or a.warmup < 1:
        p.error("--steps and --warmup must be >= 1 (step 0 is the gradient check)")
    if a.worker and not a.dry_run and not a.result:
        p.error("--worker needs --result")
    if a.worker == "dtr" and not a.dry_run and a.budget is None:
        p.error("--worker dtr needs --budget")
    if a.worker in ("probe-native", "probe-memscale") and a.batch < 1:
        p.error("--batch must be >= 1")
    return a


def model_args(a: argparse.Namespace) -> list[str]:
    """The command-line arguments a worker needs to rebuild the same model and run."""
    out = [
        f"--impl={a.impl}", f"--layers={a.layers}", f"--width={a.width}", f"--heads={a.heads}", f"--seq={a.seq}",
        f"--vocab={a.vocab}", f"--dropout={a.dropout}", f"--attn={a.attn}", f"--steps={a.steps}",
        f"--warmup={a.warmup}", f"--device={a.device}", f"--fit-threshold={a.fit_threshold}",
        f"--cpu-fit-budget={a.cpu_fit_budget}", f"--probe-steps-native={a.probe_steps_native}",
        f"--probe-steps-memscale={a.probe_steps_memscale}",
    ]
    if a.no_deterministic:
        out.append("--no-deterministic")
    if a.heuristic:
        out.append(f"--heuristic={a.heuristic}")
    return out


# --------------------------------------------------------------------------- model


def pick_impl(a: argparse.Namespace) -> str:
    """'hf' when transformers can be imported (and was not ruled out), else 'mini'."""
    if a.impl != "auto":
        return a.impl
    try:
        import transformers  # noqa: F401
    except Exception:  # noqa: BLE001 - any failure: use the built-in copy
        return "mini"
    return "hf"


def build_model(a: argparse.Namespace, impl: str) -> Any:
    """GPT-2 with random weights from seed 0, made on the CPU (identical in every process)."""
    import torch

    torch.manual_seed(0)
    if impl == "hf":
        import transformers

        transformers.logging.set_verbosity_error()
        kw: dict[str, Any] = dict(
            n_layer=a.layers, n_embd=a.width, n_head=a.heads, vocab_size=a.vocab, n_positions=a.seq,
            resid_pdrop=a.dropout, embd_pdrop=a.dropout, attn_pdrop=a.dropout, use_cache=False,
            bos_token_id=0, eos_token_id=0,
        )
        try:
            cfg = transformers.GPT2Config(attn_implementation=a.attn, **kw)
        except TypeError:
            cfg = transformers.GPT2Config(**kw)
            cfg._attn_implementation = a.attn
        return transformers.GPT2LMHeadModel(cfg)
    return _mini_gpt2(a)


def _mini_gpt2(a: argparse.Namespace) -> Any:
    """GPT-2 in plain PyTorch (used when transformers is missing): same shapes and ops."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            n = a.width
            self.ln_1, self.ln_2 = nn.LayerNorm(n), nn.LayerNorm(n)
            self.c_attn, self.c_proj = nn.Linear(n, 3 * n), nn.Linear(n, n)
            self.c_fc, self.mlp_proj = nn.Linear(n, 4 * n), nn.Linear(4 * n, n)

        def forward(self, x: Any, mask: Any) -> Any:
            B, T, C = x.shape
            h = a.heads
            q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, h, C // h).transpose(1, 2) for t in (q, k, v))
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // h))
            att = torch.where(mask[:T, :T], att, torch.finfo(att.dtype).min)
            att = F.dropout(F.softmax(att, dim=-1), a.dropout, self.training)
            y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
            x = x + F.dropout(self.c_proj(y), a.dropout, self.training)
            m = self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))
            return x + F.dropout(m, a.dropout, self.training)

    class MiniGPT2(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte, self.wpe = nn.Embedding(a.vocab, a.width), nn.Embedding(a.seq, a.width)
            self.h = nn.ModuleList(Block() for _ in range(a.layers))
            self.ln_f = nn.LayerNorm(a.width)
            self.register_buffer("mask", torch.tril(torch.ones(a.seq, a.seq, dtype=torch.bool)), persistent=False)
            for name, p in self.named_parameters():
                if name.endswith("weight") and p.dim() == 2:
                    nn.init.normal_(p, mean=0.0, std=0.02)
                elif name.endswith("bias"):
                    nn.init.zeros_(p)

        def forward(self, ids: Any) -> Any:
            T = ids.shape[1]
            pos = torch.arange(T, device=ids.device)
            x = F.dropout(self.wte(ids) + self.wpe(pos), a.dropout, self.training)
            for blk in self.h:
                x = blk(x, self.mask)
            logits = self.ln_f(x) @ self.wte.weight.t()  # tied, as GPT-2
            return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))

    return MiniGPT2()


def loss_of(model: Any, impl: str, ids: Any) -> Any:
    if impl == "hf":
        return model(input_ids=ids, labels=ids).loss
    return model(ids)


def logits_bytes(a: argparse.Namespace, batch: int) -> int:
    """Bytes of the logits (float32), the largest single op output of a step."""
    return batch * a.seq * a.vocab * 4


# --------------------------------------------------------------------------- workers


class Trainer:
    """One model, its SGD optimizer and fixed batches; runs steps with or without a region."""

    def __init__(self, a: argparse.Namespace, batch: int, region: Any = None) -> None:
        import torch

        self.torch = torch
        self.a = a
        self.impl = pick_impl(a)
        self.dev = torch.device(a.device)
        if not a.no_deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
            try:  # speed: do not fill every new tensor with NaN
                torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]
            except AttributeError:
                pass
        model = build_model(a, self.impl)
        self.n_params = sum(p.numel() for p in model.parameters())
        self.model = model.to(self.dev)
        self.model.train()
        self.params = dict(self.model.named_parameters())
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-4)
        n_batches = min(a.warmup + a.steps, 4)
        self.batches = [
            torch.randint(0, a.vocab, (batch, a.seq), generator=torch.Generator().manual_seed(1000 + i)).to(self.dev)
            for i in range(n_batches)
        ]
        self.region = region
        self.batch = batch
        self.times: list[float] = []
        self.losses: list[float] = []
        self.step_stats: list[dict[str, Any]] = []

    def sync(self) -> None:
        if self.dev.type == "cuda":
            self.torch.cuda.synchronize()

    def fwd_bwd(self, i: int) -> Any:
        """Forward and backward of step ``i`` (gradients in ``.grad``); returns the loss."""
        torch = self.torch
        for p in self.params.values():
            p.grad = None
        ids = self.batches[i % len(self.batches)]
        torch.manual_seed(100 + i)  # the same RNG stream in every process (dropout)
        if self.region is None:
            loss = loss_of(self.model, self.impl, ids)
            loss.backward()
            return loss.detach()
        with self.region:
            loss = loss_of(self.model, self.impl, ids)
            loss.backward()
        return self.region.unwrap(loss).detach()

    def step(self, i: int, after_backward: Any = None) -> float:
        """A whole training step, timed between two synchronizations; returns seconds."""
        self.sync()
        t0 = time.perf_counter()
        loss = self.fwd_bwd(i)
        if after_backward is not None:
            self.sync()
            t_pause = time.perf_counter()
            after_backward(loss)
            t0 += time.perf_counter() - t_pause  # the check is not part of the step
        self.opt.step()
        self.sync()
        dt = time.perf_counter() - t0
        self.times.append(dt)
        self.losses.append(float(loss))
        if self.region is not None:
            last = self.region.last_summary()
            self.step_stats.append({k: last.get(k) for k in ("evictions", "rematerializations", "overhead", "peak_usage", "nested_restarts")})
        return dt


def _peak_reset(a: argparse.Namespace, memscale_alloc: bool) -> None:
    if a.device != "cuda":
        return
    if memscale_alloc:
        import memscale

        memscale.reset_peak_memory_stats(0)
    else:
        import torch

        torch.cuda.reset_peak_memory_stats(0)


def _peak(a: argparse.Namespace, memscale_alloc: bool) -> int | None:
    if a.device != "cuda":
        return None
    if memscale_alloc:
        import memscale

        return int(memscale.max_memory_allocated(0))
    import torch

    return int(torch.cuda.max_memory_allocated(0))


def _device_info(a: argparse.Namespace) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"torch": torch.__version__}
    if a.device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(device_name=torch.cuda.get_device_name(0), total_memory=int(props.total_memory))
    return info


def worker_native(a: argparse.Namespace) -> dict[str, Any]:
    import torch

    tr = Trainer(a, a.batch)
    out: dict[str, Any] = _device_info(a)
    out.update(impl=tr.impl, n_params=tr.n_params, batch=a.batch, param_bytes=4 * tr.n_params)
    _peak_reset(a, False)

    def save(loss: Any) -> None:
        if a.save_grads:
            grads = {n: p.grad.detach().to("cpu") for n, p in tr.params.items() if p.grad is not None}
            os.makedirs(os.path.dirname(os.path.abspath(a.save_grads)), exist_ok=True)
            torch.save({"loss": loss.to("cpu"), "grads": grads}, a.save_grads)

    for i in range(a.warmup + a.steps):
        tr.step(i, save if i == 0 else None)
    out["peak_allocated"] = _peak(a, False)
    if a.device == "cuda":
        out["peak_reserved"] = int(torch.cuda.max_memory_reserved(0))
    else:  # no allocator statistics: the engine-counted peak of one unbudgeted region step
        import memscale

        tr.region = memscale.dtr(None)
        tr.step(0)
        out["peak_allocated"] = int(tr.region.summary()["peak_usage"])
        out["peak_note"] = "cpu: engine-counted peak of an unbudgeted DTR region step"
        tr.times.pop()
        tr.losses.pop()
    out["step_times"] = [round(t, 5) for t in tr.times]
    out["median_step_s"] = _common.median(tr.times[a.warmup:])
    out["losses"] = tr.losses
    out["grads_saved"] = a.save_grads
    print(f"native: batch {a.batch}, median step {out['median_step_s']:.4f} s, peak allocated "
          f"{_common.fmt_bytes(out['peak_allocated'])}", flush=True)
    return out


def worker_dtr(a: argparse.Namespace) -> dict[str, Any]:
    memscale_alloc = a.device == "cuda"
    import memscale

    if memscale_alloc:
        inst = memscale.install(backend="cuda")  # before anything touches CUDA
    import torch

    region = memscale.dtr(a.budget, heuristic=a.heuristic)
    tr = Trainer(a, a.batch, region)
    out: dict[str, Any] = _device_info(a)
    out.update(impl=tr.impl, n_params=tr.n_params, batch=a.batch, budget=a.budget)
    if memscale_alloc:
        out["memscale_library"] = str(inst.library)
    ref = torch.load(a.ref_grads, map_location="cpu", weights_only=True) if a.ref_grads else None
    check: dict[str, Any] = {}

    def compare(loss: Any) -> None:
        if ref is None:
            check["skipped"] = "no --ref-grads"
            return
        check["loss"] = float(loss)
        check["ref_loss"] = float(ref["loss"])
        check["loss_equal"] = bool(torch.equal(loss.to("cpu"), ref["loss"]))
        n_equal = n_close = 0
        max_diff = 0.0
        missing = []
        for name, p in tr.params.items():
            r = ref["grads"].get(name)
            if r is None or p.grad is None:
                missing.append(name)
                continue
            g = p.grad.detach().to("cpu")
            n_equal += bool(torch.equal(g, r))
            n_close += bool(torch.allclose(g, r, rtol=1e-5, atol=1e-7))
            d = float((g.double() - r.double()).abs().max()) if g.numel() else 0.0
            max_diff = max(max_diff, d if d == d else float("inf"))
        n = len(tr.params)
        check.update(params=n, bitwise_equal=n_equal, allclose=n_close, max_abs_diff=max_diff, missing=missing)
        check["grads_bitwise_equal"] = n_equal == n and not missing
        check["grads_allclose"] = n_close == n and not missing

    _peak_reset(a, memscale_alloc)
    for i in range(a.warmup + a.steps):
        tr.step(i, compare if i == 0 else None)
        print(f"  dtr step {i}: {tr.times[-1]:.3f} s {tr.step_stats[-1]}", flush=True)
    peak = _peak(a, memscale_alloc)
    if peak is None:  # cpu: the engine's count is the only one
        peak = int(region.summary()["peak_usage"])
        out["peak_note"] = "cpu: engine-counted peak (region.summary()['peak_usage'])"
    slack = logits_bytes(a, a.batch)
    out.update(
        grad_check=check,
        step_times=[round(t, 5) for t in tr.times],
        median_step_s=_common.median(tr.times[a.warmup:]),
        losses=tr.losses,
        peak_allocated=peak,
        largest_op_output_bytes=slack,
        summary={k: v for k, v in region.summary().items() if isinstance(v, (int, float, str))},
        per_step=tr.step_stats,
    )
    out["peak_over_budget_bytes"] = peak - a.budget
    out["peak_within_budget_plus_one_op"] = peak <= a.budget + slack
    if memscale_alloc:
        st = memscale.memory_stats(0)
        out["memscale_stats"] = {k: int(st[k]) for k in ("reserved_bytes.all.peak", "num_alloc_retries", "num_ooms") if k in st}
    print(f"dtr: budget {_common.fmt_bytes(a.budget)}, peak {_common.fmt_bytes(peak)}, median step "
          f"{out['median_step_s']:.4f} s, grads bitwise equal: {check.get('grads_bitwise_equal')}", flush=True)
    return out


def _classify(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".lower()
    if "out of memory" in text or "outofmemory" in text:
        return "oom"
    if "budget" in text:
        return "budget"
    return "error"


def worker_probe(a: argparse.Namespace, with_memscale: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"batch": a.batch, "allocator": "memscale+dtr" if with_memscale else "native"}
    memscale_alloc = with_memscale and a.device == "cuda"
    region = None
    if with_memscale:
        import memscale

        if memscale_alloc:
            inst = memscale.install(threshold=a.fit_threshold, backend="cuda")  # first: before CUDA use
            budget = int((inst.thresholds or {})[0])
        else:
            budget = a.cpu_fit_budget
        region = memscale.dtr(budget, heuristic=a.heuristic)
        out["budget"] = budget
    steps = a.probe_steps_memscale if with_memscale else a.probe_steps_native
    try:
        tr = Trainer(a, a.batch, region)
        out.update(_device_info(a))
        _peak_reset(a, memscale_alloc)
        for i in range(steps):
            tr.step(i)
        out.update(fits=True, steps=steps, step_times=[round(t, 4) for t in tr.times], peak_allocated=_peak(a, memscale_alloc))
        if region is not None:
            out["summary"] = {k: v for k, v in region.summary().items() if isinstance(v, (int, float, str))}
            if a.device == "cpu":  # no allocator: the budget is all there is
                out["peak_allocated"] = int(out["summary"]["peak_usage"])
    except Exception as exc:  # noqa: BLE001 - an OOM is the answer, not a failure
        out.update(fits=False, reason=_classify(exc), error=f"{type(exc).__name__}: {str(exc)[:2000]}")
        if memscale_alloc:  # what the allocator said (an OOM there may surface as another error in torch)
            try:
                from memscale._native import lib as _lib

                last = _lib.last_error()
                out["memscale_last_error"] = last[:2000]
                if out["reason"] == "error" and "out of memory" in last.lower():
                    out["reason"] = "oom"
            except Exception:  # noqa: BLE001 - best effort
                pass
    print(f"probe {out['allocator']} batch {a.batch}: {'fits' if out['fits'] else 'does not fit (' + out['reason'] + ')'}",
          flush=True)
    return out


def run_worker(a: argparse.Namespace) -> int:
    name = {"native": "gpt2_native", "dtr": "gpt2_dtr_budget", "probe-native": "gpt2_probe_native",
            "probe-memscale": "gpt2_probe_memscale"}[a.worker]
    result = _common.record(name, status="failed", worker=a.worker, device=a.device)
    try:
        if a.worker == "native":
            result.update(worker_native(a))
        elif a.worker == "dtr":
            result.update(worker_dtr(a))
        else:
            result.update(worker_probe(a, a.worker == "probe-memscale"))
        result["status"] = "ok"
        rc = 0
    except Exception as exc:  # noqa: BLE001 - reported in the JSON
        import traceback

        traceback.print_exc()
        result["error"] = f"{type(exc).__name__}: {str(exc)[:4000]}"
        print(f"FAIL {name}: {result['error']}", flush=True)
        rc = 1
    _common.write_json(a.result, result)
    return rc


# --------------------------------------------------------------------------- driver


def search(probe: Any, start: int, max_probes: int, deadline: float, max_batch: int, growth: float,
           rel_tol: float = 0.05) -> dict[str, Any]:
    """Largest batch for which ``probe(batch) -> bool | None`` is True.

    Grows the batch by ``growth`` from ``start`` until a probe fails, then
    bisects until the gap is within ``rel_tol`` of the largest fit. ``None``
    from ``probe`` means it could not run (no time left): the search stops.
    ``None`` from ``probe`` stops the search (no time left, or a probe that
    failed for another reason than memory: ``probe.why`` says which).
    Returns ``{"max_fit", "min_fail", "probes": [[batch, ok], ...], "stopped"}``.
    """
    lo, hi = 0, None
    b = max(1, min(int(start), max_batch))
    probes: list[list[Any]] = []
    stopped = "converged"
    while True:
        if len(probes) >= max_probes:
            stopped = "probe limit"
            break
        if time.monotonic() >= deadline:
            stopped = "time budget"
            break
        ok = probe(b)
        if ok is None:
            stopped = getattr(probe, "why", None) or "time budget"
            break
        probes.append([b, bool(ok)])
        if ok:
            lo = max(lo, b)
        else:
            hi = b if hi is None else min(hi, b)
        if hi is None:
            if b >= max_batch:
                stopped = "max batch"
                break
            nb = min(max_batch, max(b + 1, int(b * growth)))
        else:
            if hi - lo <= max(1, int(lo * rel_tol)):
                break
            nb = (lo + hi) // 2
            if nb <= lo or nb >= hi:
                break
        b = nb
    return {"max_fit": lo or None, "min_fail": hi, "probes": probes, "stopped": stopped}


def driver(a: argparse.Namespace) -> int:
    t_start = time.monotonic()
    deadline = t_start + a.time_budget
    out_dir = os.path.abspath(a.out_dir)
    work = os.path.abspath(a.work or os.path.join(os.environ.get("TMPDIR", "/tmp"), "memscale-gpt2-work"))
    os.makedirs(out_dir, exist_ok=True)
    os.makedirs(work, exist_ok=True)
    me = [sys.executable, os.path.abspath(__file__)]
    margs = model_args(a)
    result = _common.record(STEP, status="ok", config=vars(a).copy(), out_dir=out_dir)
    final_path = os.path.join(out_dir, f"{STEP}.json")

    def left() -> float:
        return deadline - time.monotonic()

    def worker(kind: str, extra: list[str], json_name: str, cap: float) -> dict[str, Any]:
        path = os.path.join(out_dir, json_name)
        if os.path.exists(path):
            os.remove(path)
        t = min(cap, left())
        if t < 10:
            return {"status": "not run", "reason": f"time budget used up ({a.time_budget:.0f} s)"}
        run = _common.run_child([*me, "--worker", kind, "--result", path, *margs, *extra], t)
        res = _common.read_json(path) or {"status": "crashed", "error": f"the worker wrote no result (exit {run['rc']})"}
        res["process"] = {"rc": run["rc"], "timed_out": run["timed_out"], "seconds": run["seconds"]}
        if run["timed_out"]:
            res["status"] = "timeout"
            res.setdefault("error", f"killed after {t:.0f} s")
        return res

    # (a) native baseline
    grads = os.path.join(work, "gpt2_native_grads.pt")
    native = worker("native", [f"--batch={a.batch}", f"--save-grads={grads}"], "gpt2_native.json", 180)
    result["native"] = native
    _common.write_json(final_path, result)

    # (b) memscale + DTR at fraction x native peak
    if native.get("status") == "ok" and native.get("peak_allocated"):
        budget = int(a.fraction * native["peak_allocated"])
        dtr = worker("dtr", [f"--batch={a.batch}", f"--budget={budget}", f"--ref-grads={grads}"], "gpt2_dtr_budget.json", 200)
        if dtr.get("status") == "ok" and native.get("median_step_s") and dtr.get("median_step_s"):
            dtr["step_time_ratio"] = dtr["median_step_s"] / native["median_step_s"]
        result["dtr"] = dtr
    else:
        result["dtr"] = {"status": "not run", "reason": "the native baseline failed"}
    _common.write_json(final_path, result)
    try:
        os.remove(grads)
    except OSError:
        pass

    # (c) largest batch
    if a.skip_fit:
        result["fit"] = {"status": "skipped", "reason": "--skip-fit"}
    else:
        result["fit"] = fit(a, native, worker, left)
    result["seconds"] = round(time.monotonic() - t_start, 1)
    result["summary"] = summarize(a, result)
    _common.write_json(final_path, result)
    print_summary(result["summary"])
    bad = [k for k in ("native", "dtr") if result[k].get("status") != "ok"]
    return 1 if bad else 0


def fit(a: argparse.Namespace, native: dict[str, Any], worker: Any, left: Any) -> dict[str, Any]:
    """(c): the two searches, native first (its result seeds memscale's)."""
    out: dict[str, Any] = {}
    # Predict the native limit from (a): fixed bytes (parameters + gradients) and bytes per sample.
    start = max(1, 2 * a.batch)
    total = native.get("total_memory")
    peak = native.get("peak_allocated")
    fixed = 2 * int(native.get("param_bytes") or 0)
    if total and peak and peak > fixed:
        per_sample = (peak - fixed) / a.batch
        start = max(1, int((0.95 * total - fixed) / per_sample))
        out["native_prediction"] = start
    elif a.device == "cpu":
        start = a.batch
    probe_log: dict[str, list[dict[str, Any]]] = {"native": [], "memscale": []}

    def make_probe(kind: str, key: str, cap: float, until: float) -> Any:
        def probe(b: int) -> bool | None:
            if until - time.monotonic() < 10:
                return None
            res = worker(kind, [f"--batch={b}"], f"gpt2_probe_{key}_{b}.json", min(cap, until - time.monotonic()))
            if res.get("status") == "not run":
                return None
            keep = {k: res.get(k) for k in ("batch", "fits", "reason", "error", "memscale_last_error", "status",
                                            "step_times", "peak_allocated", "budget", "summary", "process")}
            probe_log[key].append(keep)
            if res.get("status") in ("timeout", "crashed"):
                return False  # too slow, or killed (an OOM can end a process): does not fit
            if res.get("status") != "ok":  # the worker itself broke: more probes would too
                probe.why = f"probe failed: {res.get('error')}"  # type: ignore[attr-defined]
                return None
            return bool(res.get("fits"))
        return probe

    now = time.monotonic()
    native_until = now + 0.4 * max(0.0, left())
    out["native"] = search(make_probe("probe-native", "native", a.probe_timeout_native, native_until),
                           start, a.max_probes, native_until, a.max_batch, growth=1.25)
    out["native"]["runs"] = probe_log["native"]
    base = out["native"]["max_fit"] or a.batch
    until = time.monotonic() + max(0.0, left())
    out["memscale"] = search(make_probe("probe-memscale", "memscale", a.probe_timeout_memscale, until),
                             2 * base, max(1, a.max_probes - 1), until, a.max_batch, growth=1.5)
    out["memscale"]["runs"] = probe_log["memscale"]
    nm, mm = out["native"]["max_fit"], out["memscale"]["max_fit"]
    if nm and mm:
        out["batch_ratio"] = mm / nm
    return out


def summarize(a: argparse.Namespace, r: dict[str, Any]) -> dict[str, Any]:
    n, d, f = r.get("native", {}), r.get("dtr", {}), r.get("fit", {})
    gc = d.get("grad_check") or {}
    s: dict[str, Any] = {
        "model": f"GPT-2 {a.layers} layers, width {a.width}, seq {a.seq}, vocab {a.vocab}, impl {n.get('impl')}, "
                 f"attention {a.attn}, dropout {a.dropout}",
        "device": n.get("device_name"),
        "batch": a.batch,
        "native_status": n.get("status"),
        "native_median_step_s": n.get("median_step_s"),
        "native_peak_allocated": n.get("peak_allocated"),
        "dtr_status": d.get("status"),
        "dtr_budget": d.get("budget"),
        "dtr_peak_allocated": d.get("peak_allocated"),
        "dtr_peak_within_budget_plus_one_op": d.get("peak_within_budget_plus_one_op"),
        "dtr_largest_op_output_bytes": d.get("largest_op_output_bytes"),
        "dtr_median_step_s": d.get("median_step_s"),
        "step_time_ratio": d.get("step_time_ratio"),
        "grads_bitwise_equal": gc.get("grads_bitwise_equal"),
        "grads_allclose": gc.get("grads_allclose"),
        "grads_max_abs_diff": gc.get("max_abs_diff"),
        "loss_equal": gc.get("loss_equal"),
        "evictions": (d.get("summary") or {}).get("evictions"),
        "rematerializations": (d.get("summary") or {}).get("rematerializations"),
        "dtr_overhead": (d.get("summary") or {}).get("overhead"),
        "dtr_error": d.get("error") or d.get("reason"),
    }
    if isinstance(f, dict) and "native" in f:
        s.update(
            fit_native_max_batch=f["native"].get("max_fit"),
            fit_native_min_fail=f["native"].get("min_fail"),
            fit_native_stopped=f["native"].get("stopped"),
            fit_memscale_max_batch=f["memscale"].get("max_fit"),
            fit_memscale_min_fail=f["memscale"].get("min_fail"),
            fit_memscale_stopped=f["memscale"].get("stopped"),
            fit_batch_ratio=f.get("batch_ratio"),
        )
    return s


def print_summary(s: dict[str, Any]) -> None:
    print("\nGPT-2 summary")
    for k, v in s.items():
        if k.endswith("_allocated") or k.endswith("_budget") or k.endswith("_bytes"):
            v = f"{v} ({_common.fmt_bytes(v)})" if isinstance(v, int) else v
        print(f"  {k:<36} {v}")
    sys.stdout.flush()


def dry_run(a: argparse.Namespace) -> int:
    print(f"{STEP} --dry-run: plan ({'worker ' + a.worker if a.worker else 'driver'})")
    impl = pick_impl(a)
    plan = [
        f"model: GPT-2 {a.layers} layers, width {a.width}, heads {a.heads}, seq {a.seq}, vocab {a.vocab}, impl {impl}, "
        f"attention {a.attn}, dropout {a.dropout}, deterministic {not a.no_deterministic}, device {a.device}",
        f"(a) native allocator, batch {a.batch}: {a.warmup} warm-up + {a.steps} measured steps; median step time, "
        "torch.cuda.max_memory_allocated; step-0 gradients saved",
        f"(b) memscale.install() + memscale.dtr(budget={a.fraction} x native peak): step-0 loss/gradients vs native, "
        "memscale.max_memory_allocated() <= budget + logits bytes, step-time ratio, evictions/remats",
        f"(c) largest batch: native probes ({a.probe_steps_native} steps, OOM = no) from a batch predicted by (a), "
        f"growth 1.25 then bisection; memscale probes (install(threshold={a.fit_threshold!r}), dtr(budget=threshold), "
        f"{a.probe_steps_memscale} step) from 2x the native result, growth 1.5; <= {a.max_probes} probes each, "
        f"batch <= {a.max_batch}" + (" [skipped: --skip-fit]" if a.skip_fit else ""),
        f"time budget {a.time_budget:.0f} s for all subprocesses; results in {os.path.abspath(a.out_dir)}",
    ]
    for line in plan:
        print("  - " + line)
    import torch

    print(f"  torch {torch.__version__} imports")
    if impl == "hf":
        import transformers

        print(f"  transformers {transformers.__version__} imports")
    else:
        print("  transformers not used (built-in GPT-2 copy)")
    import memscale
    from memscale import dtr  # noqa: F401

    lib = _common.library_path()
    print(f"  memscale imports ({memscale.__file__}); library {lib} {'exists' if lib.exists() else 'MISSING'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return _common.driver_or_worker(STEP, parse_args(argv), dry_run, run_worker, driver)


if __name__ == "__main__":
    sys.exit(main())
