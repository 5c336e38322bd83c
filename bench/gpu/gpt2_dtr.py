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
    "95%")``, ``dtr(budget=that threshold)``) starting at twice the native result
    (the Python region) or at 3.5 times it (the native region: issue 28's
    target is >= 3.5x native's largest batch at <= 1.3x its time per sample).
    A probe fits if it completes its training steps (2 native, 1 Python region,
    2 native region by default) without an error within its time limit.

The region path (issue 28): ``--region native`` runs a memscale worker with
``MEMSCALE_NATIVE=1`` (the C++ per-op path of ``memscale/_native/csrc``, a
torch extension built at first use; when it cannot be built or loaded the
worker's status is ``unavailable`` with the reason), ``--region python`` with
``MEMSCALE_NATIVE=0``. The driver measures, for each sequence length of
``--seqs`` (each variant a fresh process): ``plain`` (a), then for each region
of ``--regions`` (in that order: the first has priority when time is short)
``REGION-region-card`` (``memscale.dtr()`` with no threshold: the budget is the
device's memory, no budget pressure) and ``REGION-region-50`` (the budget
``--fraction`` x plain's peak, (b)). Every worker reports the median GPU step
time (synchronized wall time) and, next to it, the main thread's CPU time
(``time.thread_time``) and the process's (``time.process_time``: autograd runs
a CUDA backward on a thread of its own) while the step is issued (the final
synchronization excluded: it spins). Order: per sequence length plain and the
first region's variants, then its largest-batch search (plain PyTorch's
first), then the next region's variants and search, and so on; the first
region's search leaves ``--reserve-after-fit`` seconds for the next one's
variants.

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
    p.add_argument("--seqs", default=None, help="driver: sequence lengths, comma-separated (default: --seq); the first "
                   "is the one of gpt2_native.json, (b)'s compatibility keys and the largest-batch search")
    p.add_argument("--regions", default="native,python", help="driver: region paths measured, in priority order "
                   "(native: MEMSCALE_NATIVE=1, the C++ per-op path; python: MEMSCALE_NATIVE=0); default native,python")
    p.add_argument("--region", choices=("python", "native"), default="python", help="worker dtr/probe-memscale: the region path")
    p.add_argument("--reserve-after-fit", type=float, default=45.0,
                   help="driver: seconds the first region's largest-batch search leaves for the next region's variants")
    p.add_argument("--native-ext-json", default=None, help="driver: native_ext.py's result; when it says the native "
                   "region's extension is unavailable, the native-region variants are not run (the reason is copied)")
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
    p.add_argument("--budget", default=None, help="worker dtr: budget in bytes, or 'card' (memscale.dtr() with no "
                   "threshold: the device's memory, no budget on the CPU)")
    p.add_argument("--ref-grads", help="worker dtr: the native run's step-0 gradients (.pt)")
    p.add_argument("--save-grads", help="worker native: where to save step-0 gradients (.pt)")
    p.add_argument("--heuristic", default=None, help="DTR heuristic (default: the engine's)")
    # (c)
    p.add_argument("--fit-threshold", default="95%", help="memscale.install(threshold=...) for the memscale probes (default 95%%)")
    p.add_argument("--cpu-fit-budget", type=int, default=64 << 20, help="--device cpu: DTR budget of memscale probes in bytes")
    p.add_argument("--max-probes", type=int, default=6, help="probes per search at most (default 6)")
    p.add_argument("--max-batch", type=int, default=4096, help="largest batch a search tries (default 4096)")
    p.add_argument("--probe-steps-native", type=int, default=2)
    p.add_argument("--probe-steps-memscale", type=int, default=1, help="steps of a Python-region probe (default 1)")
    p.add_argument("--probe-steps-native-region", type=int, default=2,
                   help="steps of a native-region probe (default 2: the last one's time is a steady step's)")
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
    if a.budget is not None and a.budget != "card":
        try:
            a.budget = int(a.budget)
        except ValueError:
            p.error(f"--budget {a.budget!r}: bytes or 'card'")
    try:
        a.seq_list = [int(x) for x in (a.seqs or str(a.seq)).split(",") if x.strip()]
    except ValueError:
        p.error(f"--seqs {a.seqs!r}: comma-separated integers")
    a.region_list = [x.strip() for x in a.regions.split(",") if x.strip()]
    if not a.seq_list or any(s < 2 for s in a.seq_list):
        p.error(f"--seqs {a.seqs!r}: at least one length >= 2")
    bad = [r for r in a.region_list if r not in ("native", "python")]
    if bad or len(set(a.region_list)) != len(a.region_list):
        p.error(f"--regions {a.regions!r}: native and/or python, each once")
    if a.worker in ("probe-native", "probe-memscale") and a.batch < 1:
        p.error("--batch must be >= 1")
    return a


def model_args(a: argparse.Namespace, seq: int | None = None) -> list[str]:
    """The command-line arguments a worker needs to rebuild the same model and run
    (at sequence length ``seq``, default ``--seq``)."""
    out = [
        f"--impl={a.impl}", f"--layers={a.layers}", f"--width={a.width}", f"--heads={a.heads}", f"--seq={seq or a.seq}",
        f"--vocab={a.vocab}", f"--dropout={a.dropout}", f"--attn={a.attn}", f"--steps={a.steps}",
        f"--warmup={a.warmup}", f"--device={a.device}", f"--fit-threshold={a.fit_threshold}",
        f"--cpu-fit-budget={a.cpu_fit_budget}", f"--probe-steps-native={a.probe_steps_native}",
        f"--probe-steps-memscale={a.probe_steps_memscale}", f"--probe-steps-native-region={a.probe_steps_native_region}",
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
        #: Per step, while it is issued (from its start to just before the final
        #: synchronization, which spins): the main thread's CPU time, the
        #: process's (autograd runs a CUDA backward on its own thread) and the wall time.
        self.thread_cpu: list[float] = []
        self.process_cpu: list[float] = []
        self.issue_times: list[float] = []
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
        t0, c0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
        loss = self.fwd_bwd(i)
        if after_backward is not None:
            self.sync()
            t_pause, c_pause, p_pause = time.perf_counter(), time.thread_time(), time.process_time()
            after_backward(loss)
            t0 += time.perf_counter() - t_pause  # the check is not part of the step
            c0 += time.thread_time() - c_pause
            p0 += time.process_time() - p_pause
        self.opt.step()
        t1, c1, p1 = time.perf_counter(), time.thread_time(), time.process_time()
        self.sync()
        dt = time.perf_counter() - t0
        self.times.append(dt)
        self.issue_times.append(t1 - t0)
        self.thread_cpu.append(c1 - c0)
        self.process_cpu.append(p1 - p0)
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


def cpu_report(tr: Trainer, first: int) -> dict[str, Any]:
    """Medians of the steps from ``first`` on: CPU times and wall time while
    each step is issued, next to the synchronized step time."""
    n = slice(first, None)
    out: dict[str, Any] = {
        "median_thread_cpu_s": _common.median(tr.thread_cpu[n]),
        "median_process_cpu_s": _common.median(tr.process_cpu[n]),
        "median_issue_s": _common.median(tr.issue_times[n]),
        "thread_cpu_s": [round(t, 5) for t in tr.thread_cpu],
        "process_cpu_s": [round(t, 5) for t in tr.process_cpu],
    }
    step = _common.median(tr.times[n])
    if step and out["median_thread_cpu_s"] is not None:
        out["thread_cpu_over_step"] = out["median_thread_cpu_s"] / step
    return out


def use_region_path(region: str) -> None:
    """``MEMSCALE_NATIVE`` for ``region`` (native: 1, python: 0), before memscale is used."""
    os.environ["MEMSCALE_NATIVE"] = "1" if region == "native" else "0"


def native_extension() -> dict[str, Any]:
    """Build or load the native region's extension now (not inside the first
    step): ``{"available", "seconds", "path", "reason"}``."""
    from memscale._native import region_ext

    t0 = time.monotonic()
    ext = region_ext.extension()
    out: dict[str, Any] = {"available": ext is not None, "seconds": round(time.monotonic() - t0, 2)}
    try:
        out["path"] = str(region_ext.cached_path())
    except Exception as exc:  # noqa: BLE001 - informational
        out["path"] = f"? ({type(exc).__name__}: {exc})"
    if ext is None:
        out["reason"] = region_ext.unavailable_reason()
    return out


class Unavailable(Exception):
    """The native region's extension cannot be used (the worker's status says so)."""


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
        for lst in (tr.thread_cpu, tr.process_cpu, tr.issue_times):
            lst.pop()
    out["step_times"] = [round(t, 5) for t in tr.times]
    out["median_step_s"] = _common.median(tr.times[a.warmup:])
    out.update(cpu_report(tr, a.warmup))
    out["losses"] = tr.losses
    out["grads_saved"] = a.save_grads
    print(f"native: batch {a.batch}, seq {a.seq}, median step {out['median_step_s']:.4f} s (main thread CPU "
          f"{out['median_thread_cpu_s']:.4f} s), peak allocated {_common.fmt_bytes(out['peak_allocated'])}", flush=True)
    return out


def _region_setup(a: argparse.Namespace, out: dict[str, Any]) -> None:
    """The region path of a memscale worker (after ``memscale.install``, so
    that nothing touches CUDA first): ``MEMSCALE_NATIVE`` set, and for the
    native one its extension built or loaded (raises :class:`Unavailable`)."""
    use_region_path(a.region)
    out["region"] = a.region
    if a.region == "native":
        ext = native_extension()
        out["native_extension"] = ext
        if not ext["available"]:
            raise Unavailable(f"the native region's extension cannot be used: {ext.get('reason')}")


def _region_used(region: Any, out: dict[str, Any], wanted: str) -> None:
    """Which path the region's entries ran on (``region.native`` of the last entry)."""
    native = getattr(region, "native", None)
    out["region_path_used"] = None if native is None else ("native" if native else "python")
    if native is not None and (wanted == "native") != bool(native):
        raise RuntimeError(f"asked for the {wanted} region, the entries ran on the {out['region_path_used']} one")


def worker_dtr(a: argparse.Namespace) -> dict[str, Any]:
    memscale_alloc = a.device == "cuda"
    out: dict[str, Any] = {}
    import memscale

    if memscale_alloc:
        inst = memscale.install(backend="cuda")  # before anything touches CUDA
    _region_setup(a, out)
    import torch

    # 'card': no threshold set, so the default budget is the device's memory
    # under the memscale allocator (no budget on the CPU).
    region = memscale.dtr(heuristic=a.heuristic) if a.budget == "card" else memscale.dtr(a.budget, heuristic=a.heuristic)
    tr = Trainer(a, a.batch, region)
    out.update(_device_info(a))
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
        if i == 0:
            _region_used(region, out, a.region)
        print(f"  dtr step {i} ({a.region} region): {tr.times[-1]:.3f} s, main thread CPU {tr.thread_cpu[-1]:.3f} s "
              f"{tr.step_stats[-1]}", flush=True)
    summary = {k: v for k, v in region.summary().items() if isinstance(v, (int, float, str))}
    if a.budget == "card":
        out["budget"] = summary.get("budget")
        out["budget_source"] = summary.get("budget_source")
    budget = out["budget"] if isinstance(out["budget"], int) and out["budget"] > 0 else None
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
        summary=summary,
        per_step=tr.step_stats,
    )
    out.update(cpu_report(tr, a.warmup))
    if budget is not None:
        out["peak_over_budget_bytes"] = peak - budget
        out["peak_within_budget_plus_one_op"] = peak <= budget + slack
    if memscale_alloc:
        st = memscale.memory_stats(0)
        out["memscale_stats"] = {k: int(st[k]) for k in ("reserved_bytes.all.peak", "num_alloc_retries", "num_ooms") if k in st}
    print(f"dtr ({a.region} region): budget {_common.fmt_bytes(budget)}, peak {_common.fmt_bytes(peak)}, median step "
          f"{out['median_step_s']:.4f} s (main thread CPU {out['median_thread_cpu_s']:.4f} s), grads bitwise equal: "
          f"{check.get('grads_bitwise_equal')}", flush=True)
    return out


def _classify(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".lower()
    if "out of memory" in text or "outofmemory" in text:
        return "oom"
    if "budget" in text:
        return "budget"
    return "error"


def worker_probe(a: argparse.Namespace, with_memscale: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"batch": a.batch, "allocator": f"memscale+dtr ({a.region} region)" if with_memscale else "native"}
    memscale_alloc = with_memscale and a.device == "cuda"
    region = None
    if with_memscale:
        import memscale

        if memscale_alloc:
            inst = memscale.install(threshold=a.fit_threshold, backend="cuda")  # first: before CUDA use
            budget = int((inst.thresholds or {})[0])
        else:
            budget = a.cpu_fit_budget
        _region_setup(a, out)
        region = memscale.dtr(budget, heuristic=a.heuristic)
        out["budget"] = budget
    steps = a.probe_steps_native
    if with_memscale:
        steps = a.probe_steps_native_region if a.region == "native" else a.probe_steps_memscale
    try:
        tr = Trainer(a, a.batch, region)
        out.update(_device_info(a))
        _peak_reset(a, memscale_alloc)
        for i in range(steps):
            tr.step(i)
            if i == 0 and region is not None:
                _region_used(region, out, a.region)
        out.update(fits=True, steps=steps, step_times=[round(t, 4) for t in tr.times], peak_allocated=_peak(a, memscale_alloc),
                   thread_cpu_s=[round(t, 4) for t in tr.thread_cpu])
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
    result = _common.record(name, status="failed", worker=a.worker, device=a.device, seq=a.seq)
    if a.worker in ("dtr", "probe-memscale"):
        result["region"] = a.region
    try:
        if a.worker == "native":
            result.update(worker_native(a))
        elif a.worker == "dtr":
            result.update(worker_dtr(a))
        else:
            result.update(worker_probe(a, a.worker == "probe-memscale"))
        result["status"] = "ok"
        rc = 0
    except Unavailable as exc:
        result.update(status="unavailable", reason=str(exc))
        print(f"UNAVAILABLE {name}: {exc}", flush=True)
        rc = 1
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
           rel_tol: float = 0.05, shrink: float = 0.5) -> dict[str, Any]:
    """Largest batch for which ``probe(batch) -> bool | None`` is True.

    Grows the batch by ``growth`` from ``start`` until a probe fails, then
    bisects until the gap is within ``rel_tol`` of the largest fit; while
    nothing fitted yet, the next batch is ``shrink`` x the smallest failing
    one (a start just above the limit needs one step down, not a halving). ``None``
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
            nb = (lo + hi) // 2 if lo else max(1, int(hi * shrink))
            if nb <= lo or nb >= hi:
                break
        b = nb
    return {"max_fit": lo or None, "min_fail": hi, "probes": probes, "stopped": stopped}


def variant_names(a: argparse.Namespace, region: str) -> list[tuple[str, str]]:
    """A region path's variants, in the order they run: ``(name, budget kind)``,
    the kind ``fraction`` (``--fraction`` x plain's peak) or ``card``."""
    return [(f"{region}-region-{a.fraction * 100:g}", "fraction"), (f"{region}-region-card", "card")]


#: Issue 28's targets for the native region on a GPU.
TARGET_CARD_RATIO = 1.03  # at the card's size: step time <= 1.03x plain
TARGET_FRACTION_EXCESS = 0.10  # at 50 %: step time / plain <= 1.10 + (compute overhead - 1)
TARGET_BATCH_RATIO = 3.5  # largest batch >= 3.5x plain's ...
TARGET_PER_SAMPLE_RATIO = 1.3  # ... at <= 1.3x plain's time per sample


def _native_ext_unavailable(path: str | None) -> str | None:
    """The reason native_ext.py gave for the extension being unavailable, else None."""
    if not path:
        return None
    r = _common.read_json(path)
    if isinstance(r, dict) and r.get("status") == "unavailable":
        return f"native_ext.py: {r.get('reason')}"
    return None


def driver(a: argparse.Namespace) -> int:
    t_start = time.monotonic()
    deadline = t_start + a.time_budget
    out_dir = os.path.abspath(a.out_dir)
    work = os.path.abspath(a.work or os.path.join(os.environ.get("TMPDIR", "/tmp"), "memscale-gpt2-work"))
    os.makedirs(out_dir, exist_ok=True)
    os.makedirs(work, exist_ok=True)
    me = [sys.executable, os.path.abspath(__file__)]
    seqs = a.seq_list
    primary = seqs[0]
    config = {k: v for k, v in vars(a).items()}
    result = _common.record(STEP, status="ok", config=config, out_dir=out_dir, seqs=seqs, regions=a.region_list)
    runs: dict[str, dict[str, Any]] = {str(s): {} for s in seqs}
    result["runs"] = runs
    final_path = os.path.join(out_dir, f"{STEP}.json")
    unavailable: dict[str, str] = {}
    why = _native_ext_unavailable(a.native_ext_json)
    if why and "native" in a.region_list:
        unavailable["native"] = why
        print(f"native region: not measured: {why}", flush=True)
    result["native_region_unavailable"] = why

    def left() -> float:
        return deadline - time.monotonic()

    def save() -> None:
        _common.write_json(final_path, result)

    def worker(kind: str, extra: list[str], json_name: str, cap: float, seq: int = primary) -> dict[str, Any]:
        path = os.path.join(out_dir, json_name)
        if os.path.exists(path):
            os.remove(path)
        t = min(cap, left())
        if t < 10:
            return {"status": "not run", "reason": f"time budget used up ({a.time_budget:.0f} s)"}
        run = _common.run_child([*me, "--worker", kind, "--result", path, *model_args(a, seq), *extra], t)
        res = _common.read_json(path) or {"status": "crashed", "error": f"the worker wrote no result (exit {run['rc']})"}
        res["process"] = {"rc": run["rc"], "timed_out": run["timed_out"], "seconds": run["seconds"]}
        if run["timed_out"]:
            res["status"] = "timeout"
            res.setdefault("error", f"killed after {t:.0f} s")
        return res

    grads = {s: os.path.join(work, f"gpt2_native_grads_s{s}.pt") for s in seqs}

    def plain(seq: int) -> None:
        """(a) at ``seq``: PyTorch's allocator, no memscale (the first length's is gpt2_native.json)."""
        name = "gpt2_native.json" if seq == primary else f"gpt2_native_s{seq}.json"
        runs[str(seq)]["plain"] = worker("native", [f"--batch={a.batch}", f"--save-grads={grads[seq]}"], name, 180, seq)
        save()

    def region_variants(region: str, seq: int, kinds: tuple[str, ...] = ("fraction", "card")) -> None:
        """(b) at ``seq`` on one region path: at ``--fraction`` x plain's peak and at the card's size."""
        base = runs[str(seq)].get("plain") or {}
        for vname, kind in variant_names(a, region):
            if kind not in kinds:
                continue
            if region in unavailable:
                runs[str(seq)][vname] = {"status": "not run", "reason": f"the native region is unavailable: {unavailable[region]}"}
                continue
            if kind == "fraction":
                if base.get("status") != "ok" or not base.get("peak_allocated"):
                    runs[str(seq)][vname] = {"status": "not run", "reason": "the plain run failed (its peak sets the budget)"}
                    continue
                budget = str(int(a.fraction * base["peak_allocated"]))
            else:
                budget = "card"
            extra = [f"--batch={a.batch}", f"--budget={budget}", f"--region={region}"]
            if base.get("status") == "ok" and os.path.exists(grads[seq]):
                extra.append(f"--ref-grads={grads[seq]}")
            res = worker("dtr", extra, f"gpt2_{vname}_s{seq}.json", 200, seq)
            res["variant"] = vname
            if res.get("status") == "unavailable":
                unavailable[region] = str(res.get("reason"))
            if res.get("status") == "ok" and base.get("median_step_s") and res.get("median_step_s"):
                res["step_time_ratio"] = res["median_step_s"] / base["median_step_s"]
                overhead = (res.get("summary") or {}).get("overhead")
                if isinstance(overhead, (int, float)):
                    res["ratio_minus_overhead"] = res["step_time_ratio"] - overhead
                if base.get("median_thread_cpu_s") and res.get("median_thread_cpu_s"):
                    res["thread_cpu_ratio"] = res["median_thread_cpu_s"] / base["median_thread_cpu_s"]
            runs[str(seq)][vname] = res
            save()

    fits: dict[str, Any] = {}
    result["fit"] = {"status": "skipped", "reason": "--skip-fit"} if a.skip_fit else fits
    try:
        regions = list(a.region_list)
        # Per sequence length: plain, then the first region's variants.
        for seq in seqs:
            plain(seq)
            if regions:
                region_variants(regions[0], seq)
        # (c) plain's largest batch, then the first region's; the rest of the
        # regions after it (their variants first, then their search).
        if not a.skip_fit:
            keep = a.reserve_after_fit if len(regions) > 1 else 0.0
            until = time.monotonic() + max(0.0, left() - keep)
            fit_plain(a, runs[str(primary)].get("plain") or {}, worker, fits, until, primary, regions[:1])
            if regions:
                fit_region(a, regions[0], worker, fits, until, primary, unavailable)
        for region in regions[1:]:  # at every length the budgeted variant first, then the card's size
            for kind in ("fraction", "card"):
                for seq in seqs:
                    region_variants(region, seq, (kind,))
            if not a.skip_fit:
                fit_region(a, region, worker, fits, deadline, primary, unavailable)
            save()
    finally:
        for path in grads.values():
            try:
                os.remove(path)
            except OSError:
                pass
    result["native_region_unavailable"] = unavailable.get("native")
    # Compatibility keys (summarize.py's section 3, fresh_warm.py): the first length's plain and Python-region runs.
    result["native"] = runs[str(primary)].get("plain") or {"status": "not run"}
    frac = variant_names(a, "python")[0][0]
    result["dtr"] = runs[str(primary)].get(frac) or {"status": "not run", "reason": "the Python region was not measured"}
    result["seconds"] = round(time.monotonic() - t_start, 1)
    result["summary"] = summarize(a, result)
    save()
    print_summary(result["summary"])
    bad = [f"{seq}/{name}" for seq, vs in runs.items() for name, r in vs.items()
           if r.get("status") in ("failed", "crashed", "timeout", "unavailable")]
    if (runs[str(primary)].get("plain") or {}).get("status") != "ok":
        bad.append(f"{primary}/plain")
    if bad:
        print(f"not ok: {', '.join(bad)}", flush=True)
    return 1 if bad else 0


def _probe_factory(worker: Any, log: list[dict[str, Any]], seq: int, unavailable: dict[str, str]) -> Any:
    def make_probe(kind: str, key: str, extra: list[str], cap: float, until: float, least: float = 10.0) -> Any:
        def probe(b: int) -> bool | None:
            t = min(cap, until - time.monotonic())
            if t < least:
                return None
            res = worker(kind, [f"--batch={b}", *extra], f"gpt2_probe_{key}_{b}.json", t, seq)
            if res.get("status") == "not run":
                return None
            keep = {k: res.get(k) for k in ("batch", "fits", "reason", "error", "memscale_last_error", "status",
                                            "step_times", "thread_cpu_s", "peak_allocated", "budget", "summary",
                                            "region_path_used", "process")}
            log.append(keep)
            if res.get("status") == "unavailable":
                unavailable["native"] = str(res.get("reason"))
                probe.why = f"unavailable: {res.get('reason')}"  # type: ignore[attr-defined]
                return None
            if res.get("status") == "timeout" and t < cap:  # cut short by the search's time, not its own limit
                probe.why = "time budget (the last probe was cut short)"  # type: ignore[attr-defined]
                return None
            if res.get("status") in ("timeout", "crashed"):
                return False  # too slow, or killed (an OOM can end a process): does not fit
            if res.get("status") != "ok":  # the worker itself broke: more probes would too
                probe.why = f"probe failed: {res.get('error')}"  # type: ignore[attr-defined]
                return None
            return bool(res.get("fits"))
        return probe
    return make_probe


def _per_sample(search_result: dict[str, Any]) -> float | None:
    """Seconds per sample of the last step of the largest fitting probe."""
    best = search_result.get("max_fit")
    for r in search_result.get("runs") or []:
        if r.get("batch") == best and r.get("fits") and r.get("step_times"):
            return float(r["step_times"][-1]) / best
    return None


def fit_plain(a: argparse.Namespace, native: dict[str, Any], worker: Any, fits: dict[str, Any], until: float,
              seq: int, first_region: list[str]) -> None:
    """(c), plain PyTorch: from a batch predicted by (a); a share of the time to ``until``."""
    # Predict the native limit from (a): fixed bytes (parameters + gradients) and bytes per sample.
    start = max(1, 2 * a.batch)
    total = native.get("total_memory")
    peak = native.get("peak_allocated")
    fixed = 2 * int(native.get("param_bytes") or 0)
    if total and peak and peak > fixed:
        per_sample = (peak - fixed) / a.batch
        start = max(1, int((0.95 * total - fixed) / per_sample))
        fits["native_prediction"] = start
    elif a.device == "cpu":
        start = a.batch
    fits["seq"] = seq
    log: list[dict[str, Any]] = []
    make_probe = _probe_factory(worker, log, seq, {})
    # The region's probes take longer (two steps of a much larger batch): plain gets 35 %.
    share = 0.35 if first_region else 1.0
    plain_until = time.monotonic() + share * max(0.0, until - time.monotonic())
    fits["native"] = search(make_probe("probe-native", "native", [], a.probe_timeout_native, plain_until),
                            start, a.max_probes, plain_until, a.max_batch, growth=1.25, shrink=0.8)
    fits["native"]["runs"] = log
    fits["native"]["time_per_sample_s"] = _per_sample(fits["native"])


def fit_region(a: argparse.Namespace, region: str, worker: Any, fits: dict[str, Any], until: float, seq: int,
               unavailable: dict[str, str]) -> None:
    """(c), memscale + DTR on one region path, from a multiple of plain's largest batch."""
    key = f"{region}-region"
    if region in unavailable:
        fits[key] = {"status": "not run", "reason": f"the native region is unavailable: {unavailable[region]}",
                     "max_fit": None, "min_fail": None, "stopped": "unavailable", "runs": []}
        return
    base = (fits.get("native") or {}).get("max_fit") or a.batch
    if region == "native":  # issue 28's target first: does 3.5x plain's largest batch fit?
        start, growth = math.ceil(TARGET_BATCH_RATIO * base), 1.25
    else:
        start, growth = 2 * base, 1.5
    log: list[dict[str, Any]] = []
    make_probe = _probe_factory(worker, log, seq, unavailable)
    cap = a.probe_timeout_memscale * (1.5 if region == "native" else 1.0)
    fits[key] = search(make_probe("probe-memscale", key, [f"--region={region}"], cap, until, least=25.0),
                       start, max(1, a.max_probes - 1), until, a.max_batch, growth=growth,
                       shrink=0.8 if region == "native" else 0.5)
    r = fits[key]
    r["runs"] = log
    r["start"] = start
    r["time_per_sample_s"] = _per_sample(r)
    nm = (fits.get("native") or {}).get("max_fit")
    if nm and r.get("max_fit"):
        r["batch_ratio"] = r["max_fit"] / nm
        pn = (fits.get("native") or {}).get("time_per_sample_s")
        if pn and r["time_per_sample_s"]:
            r["time_per_sample_ratio"] = r["time_per_sample_s"] / pn
    if region == "python":  # the key the earlier results used
        fits["memscale"] = r
        if r.get("batch_ratio"):
            fits["batch_ratio"] = r["batch_ratio"]


def _row(seq: str, name: str, r: dict[str, Any], plain_r: dict[str, Any]) -> dict[str, Any]:
    """One line of the side-by-side table (plain, native region, Python region)."""
    s = r.get("summary") or {}
    gc = r.get("grad_check") or {}
    row: dict[str, Any] = {
        "seq": int(seq), "variant": name, "status": r.get("status"),
        "median_step_s": r.get("median_step_s"),
        "step_time_ratio": 1.0 if name == "plain" and r.get("median_step_s") else r.get("step_time_ratio"),
        "overhead": s.get("overhead"), "ratio_minus_overhead": r.get("ratio_minus_overhead"),
        "median_thread_cpu_s": r.get("median_thread_cpu_s"), "median_process_cpu_s": r.get("median_process_cpu_s"),
        "median_issue_s": r.get("median_issue_s"), "thread_cpu_ratio": r.get("thread_cpu_ratio"),
        "peak_allocated": r.get("peak_allocated"), "budget": r.get("budget"),
        "evictions": s.get("evictions"), "rematerializations": s.get("rematerializations"),
        "grads_bitwise_equal": gc.get("grads_bitwise_equal"), "region_path_used": r.get("region_path_used"),
        "seconds": (r.get("process") or {}).get("seconds"),
        "error": r.get("error") or (r.get("reason") if r.get("status") != "ok" else None),
    }
    ratio = row["step_time_ratio"]
    if name.endswith("-card"):
        row["target"] = f"<= {TARGET_CARD_RATIO:.2f}x"
        row["meets_target"] = ratio <= TARGET_CARD_RATIO if isinstance(ratio, (int, float)) else None
    elif name != "plain":
        row["target"] = f"ratio - overhead <= +{TARGET_FRACTION_EXCESS:.2f}"
        ex = row["ratio_minus_overhead"]
        row["meets_target"] = ex <= TARGET_FRACTION_EXCESS if isinstance(ex, (int, float)) else None
    return row


def summarize(a: argparse.Namespace, r: dict[str, Any]) -> dict[str, Any]:
    n, d, f = r.get("native", {}), r.get("dtr", {}), r.get("fit", {})
    gc = d.get("grad_check") or {}
    s: dict[str, Any] = {
        "model": f"GPT-2 {a.layers} layers, width {a.width}, seq {a.seq_list[0]}, vocab {a.vocab}, impl {n.get('impl')}, "
                 f"attention {a.attn}, dropout {a.dropout}",
        "device": n.get("device_name"),
        "batch": a.batch,
        "seqs": a.seq_list,
        "regions": a.region_list,
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
        "native_region_unavailable": r.get("native_region_unavailable"),
    }
    table = []
    for seq, vs in (r.get("runs") or {}).items():
        plain_r = vs.get("plain") or {}
        for name, run in vs.items():
            table.append(_row(seq, name, run, plain_r))
    s["table"] = table
    if isinstance(f, dict) and "native" in f:
        s.update(
            fit_seq=f.get("seq"),
            fit_native_max_batch=f["native"].get("max_fit"),
            fit_native_min_fail=f["native"].get("min_fail"),
            fit_native_stopped=f["native"].get("stopped"),
            fit_native_time_per_sample_s=f["native"].get("time_per_sample_s"),
        )
        for key, short in (("native-region", "native_region"), ("python-region", "memscale")):
            g = f.get(key)
            if not isinstance(g, dict):
                continue
            s.update({
                f"fit_{short}_max_batch": g.get("max_fit"),
                f"fit_{short}_min_fail": g.get("min_fail"),
                f"fit_{short}_stopped": g.get("stopped") if g.get("status") != "not run" else g.get("reason"),
                f"fit_{short}_batch_ratio": g.get("batch_ratio"),
                f"fit_{short}_time_per_sample_ratio": g.get("time_per_sample_ratio"),
            })
        s["fit_batch_ratio"] = s.get("fit_memscale_batch_ratio")
        br, tr = s.get("fit_native_region_batch_ratio"), s.get("fit_native_region_time_per_sample_ratio")
        if br is not None:
            s["fit_native_region_meets_target"] = bool(br >= TARGET_BATCH_RATIO and tr is not None
                                                       and tr <= TARGET_PER_SAMPLE_RATIO)
    return s


def print_summary(s: dict[str, Any]) -> None:
    print("\nGPT-2 summary")
    for k, v in s.items():
        if k == "table":
            continue
        if k.endswith("_allocated") or k.endswith("_budget") or k.endswith("_bytes"):
            v = f"{v} ({_common.fmt_bytes(v)})" if isinstance(v, int) else v
        print(f"  {k:<40} {v}")
    print("\n  seq  variant                 status      step s   /plain  -ovh    CPU(main) s  CPU(proc) s  target")
    for row in s.get("table") or []:
        def f(x: Any, fmt: str) -> str:
            return fmt.format(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else "-"
        print(f"  {row['seq']:<4} {row['variant']:<23} {str(row['status']):<11} {f(row['median_step_s'], '{:.4f}'):>7} "
              f"{f(row['step_time_ratio'], '{:.3f}'):>7} {f(row['ratio_minus_overhead'], '{:+.3f}'):>6} "
              f"{f(row['median_thread_cpu_s'], '{:.4f}'):>12} {f(row['median_process_cpu_s'], '{:.4f}'):>12}  "
              f"{row.get('target', '')} {'' if row.get('meets_target') is None else ('met' if row['meets_target'] else 'NOT met')}")
    sys.stdout.flush()


def dry_run(a: argparse.Namespace) -> int:
    print(f"{STEP} --dry-run: plan ({'worker ' + a.worker if a.worker else 'driver'})")
    impl = pick_impl(a)
    variants = ", ".join(v for r in a.region_list for v, _ in variant_names(a, r))
    plan = [
        f"model: GPT-2 {a.layers} layers, width {a.width}, heads {a.heads}, seq {a.seq_list}, vocab {a.vocab}, impl {impl}, "
        f"attention {a.attn}, dropout {a.dropout}, deterministic {not a.no_deterministic}, device {a.device}",
        f"(a) plain: PyTorch's allocator, batch {a.batch}, each sequence length: {a.warmup} warm-up + {a.steps} measured "
        "steps; median step time, main-thread and process CPU time per step, torch.cuda.max_memory_allocated; "
        "step-0 gradients saved",
        f"(b) memscale.install() + memscale.dtr(budget={a.fraction} x plain's peak, or no threshold: the card), on the "
        f"region paths {a.region_list} (native: MEMSCALE_NATIVE=1, python: MEMSCALE_NATIVE=0), each its own process: "
        f"{variants}; step-0 loss/gradients vs plain, peak vs budget, step-time and CPU-time ratios, evictions/remats",
        f"(c) largest batch at seq {a.seq_list[0]}: plain probes ({a.probe_steps_native} steps, OOM = no) from a batch "
        f"predicted by (a), growth 1.25 then bisection; memscale probes (install(threshold={a.fit_threshold!r}), "
        f"dtr(budget=threshold)): native region ({a.probe_steps_native_region} steps) from {TARGET_BATCH_RATIO}x the "
        f"plain result, growth 1.25; Python region ({a.probe_steps_memscale} step) from 2x, growth 1.5; "
        f"<= {a.max_probes} probes each, batch <= {a.max_batch}" + (" [skipped: --skip-fit]" if a.skip_fit else ""),
        f"order: per length plain + {a.region_list[:1]} variants, {a.region_list[:1]} search (leaving "
        f"{a.reserve_after_fit:.0f} s), then {a.region_list[1:]} variants and search",
        f"time budget {a.time_budget:.0f} s for all subprocesses; results in {os.path.abspath(a.out_dir)}",
    ]
    why = _native_ext_unavailable(a.native_ext_json)
    if why:
        plan.append(f"native region not measured: {why}")
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
    from memscale._native import region_ext

    lib = _common.library_path()
    print(f"  memscale imports ({memscale.__file__}); library {lib} {'exists' if lib.exists() else 'MISSING'}")
    try:
        cached = region_ext.cached_path()
        state = "built" if cached.exists() else "not built yet: the first native worker builds it"
        print(f"  native region's extension: {cached} ({state})")
    except Exception as exc:  # noqa: BLE001 - informational
        print(f"  native region's extension: cannot name its build ({type(exc).__name__}: {exc})")
    return 0


def main(argv: list[str] | None = None) -> int:
    return _common.driver_or_worker(STEP, parse_args(argv), dry_run, run_worker, driver)


if __name__ == "__main__":
    sys.exit(main())
