"""Training steps under torch.distributed (gloo, CPU), plain and with memscale.

    torchrun --standalone --nproc-per-node 2 dist_steps.py KIND OUT [BUDGET]

KIND: ``ddp`` or ``fsdp`` (FSDP2 ``fully_shard`` per block and at the root):
3 SGD steps plainly, then the same 3 steps from the same initial model with
``memscale.wrap(model, Config(threshold=BUDGET))``; ``ddp-blocks`` and
``fsdp-blocks``: the same with the blocks in a ``ModuleList`` and
``Config(unit="block", threshold=BUDGET)`` (BUDGET: bytes of block
activations, block-level DTR); ``collectives``: ops
that include an in-place ``all_reduce`` and a functional ``all_reduce``, run
plainly and then in a region: on rank 0 under the stress setting (every
evictable tensor evicted after every op), on rank 1 unbudgeted (nothing
evicted). A collective re-run by rank 0 alone would find no peer (the process
group's timeout is short) or pair with another collective of rank 1. Writes ``OUT.RANK`` (torch.save):
the plain and memscale records and the memscale summary.

``plain``: ``KIND`` only, no memscale; used to run the script itself under
``python -m memscale run`` (``OUT.RANK`` then holds that run's records).
"""

from __future__ import annotations

import datetime
import gc
import sys
from typing import Any

import torch
import torch.distributed as dist

kind, out = sys.argv[1], sys.argv[2]
budget = int(sys.argv[3]) if kind in ("ddp", "fsdp", "ddp-blocks", "fsdp-blocks") else 0
# A rank that ran a collective alone would wait for its peer: fail fast instead.
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=10 if kind == "collectives" else 60))
rank = dist.get_rank()


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(256, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        return torch.tanh(torch.nn.functional.gelu(y) * 1.5).sin() + y


class Stack(torch.nn.Module):
    """Four blocks in a ModuleList (what memscale.blocks finds) and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(Block() for _ in range(4))
        self.head = torch.nn.Linear(256, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def make_model(parallel: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if parallel.endswith("-blocks"):
        parallel = parallel.removesuffix("-blocks")
        model: torch.nn.Module = Stack()
        layers = list(model.layers)
    else:
        model = torch.nn.Sequential(*[Block() for _ in range(4)], torch.nn.Linear(256, 1))
        layers = list(model)
    if parallel == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    from torch.distributed.fsdp import fully_shard

    for layer in layers:
        fully_shard(layer)
    return fully_shard(model)


def local(t: torch.Tensor) -> torch.Tensor:
    return (t.to_local() if hasattr(t, "to_local") else t).detach().clone()


def train(parallel: str, wrap: Any = None) -> list[dict[str, Any]]:
    model = make_model(parallel)
    if wrap is not None:
        wrap(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.Generator().manual_seed(rank + 1)
    steps = []
    for _ in range(3):
        loss = model(torch.randn(512, 256, generator=data)).pow(2).mean()
        loss.backward()
        # The full gradient: a functional all-gather while the step is open.
        full = {
            n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad) for n, p in model.named_parameters()
        }
        steps.append({"loss": loss.detach().clone(), "grads": {n: local(g) for n, g in full.items()}})
        optimizer.step()
        optimizer.zero_grad()
    steps[-1]["params"] = {n: local(p) for n, p in model.named_parameters()}
    return steps


def collectives() -> list[dict[str, Any]]:
    from torch.distributed import _functional_collectives as funcol

    x = torch.randn(256, 256, generator=torch.Generator().manual_seed(rank + 1))
    y = x * 2
    y = y.sin()
    dist.all_reduce(y)  # in place, on a region tensor
    z = funcol.all_reduce(y.cos(), "sum", dist.group.WORLD)  # functional
    w = (z.exp() * y).tanh()
    loss = (w + z).sum() + y.pow(2).sum()
    return [{"loss": loss.detach().clone(), "grads": {"y": y.detach().clone(), "z": z.detach().clone()}}]


def main() -> None:
    if kind == "plain":  # under `python -m memscale run`: the script as a user writes it
        torch.save({"memscale": train(sys.argv[3])}, f"{out}.{rank}")
        return
    import memscale

    if kind == "collectives":
        plain = collectives()
        region = memscale.dtr(stress=True) if rank == 0 else memscale.dtr(None)
        with region:
            got = collectives()
        dist.barrier()
        summary = dict(region.summary())
    else:
        plain = train(kind)
        wrapped: list[Any] = []

        unit = "block" if kind.endswith("-blocks") else "op"

        def wrap(model: torch.nn.Module) -> None:
            wrapped.append(memscale.wrap(model, memscale.Config(threshold=budget, unit=unit)))

        got = train(kind, wrap)
        summary = memscale.summary(wrapped[0]).as_dict()
    torch.save({"plain": plain, "memscale": got, "summary": summary}, f"{out}.{rank}")


try:
    main()
finally:
    # The models go (with their DDP reducer's or FSDP's gloo work) while the
    # interpreter is whole - a model kept by a reference cycle (module hooks)
    # would otherwise be destroyed during finalization, which can abort with
    # "terminate called without an active exception" (pytorch #190489, #179291;
    # once in CI here, 2026-11-27, ddp-blocks) - and the group is destroyed
    # even when main() raised, so its traceback is not lost to such an abort.
    gc.collect()
    dist.destroy_process_group()
