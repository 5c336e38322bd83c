"""The models and loops the block-level DTR tests share (memscale.blocks)."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from memscale._blocks import BlockDTR


class Block(nn.Module):
    """A residual MLP block with dropout, optionally batch norm."""

    def __init__(self, width: int, norm: bool = False, p: float = 0.1) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)
        self.drop = nn.Dropout(p)
        self.norm = nn.BatchNorm1d(width) if norm else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc1(self.norm(x)))
        return x + self.drop(self.fc2(h))


class Net(nn.Module):
    def __init__(self, depth: int = 4, width: int = 32, norm: bool = False, p: float = 0.1) -> None:
        super().__init__()
        self.inp = nn.Linear(8, width)
        self.layers = nn.ModuleList(Block(width, norm, p) for _ in range(depth))
        self.out = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for layer in self.layers:
            h = layer(h)
        return self.out(h).square().mean()


def batch(step: int) -> torch.Tensor:
    return torch.randn(64, 8, generator=torch.Generator().manual_seed(step))


def train(model: nn.Module, steps: int = 3) -> list[dict[str, Any]]:
    """Forward, backward and SGD per step; what each step produced."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    out = []
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        torch.manual_seed(100 + step)
        loss = model(batch(step))
        loss.backward()
        out.append(
            {
                "loss": loss.detach().clone(),
                "grads": [p.grad.clone() for p in model.parameters()],
                "buffers": [b.clone() for b in model.buffers()],
            }
        )
        opt.step()
    return out


def assert_bitwise(ref: list[dict[str, Any]], got: list[dict[str, Any]]) -> None:
    for step, (a, b) in enumerate(zip(ref, got, strict=True)):
        assert torch.equal(a["loss"], b["loss"]), f"step {step}: loss"
        for i, (x, y) in enumerate(zip(a["grads"], b["grads"], strict=True)):
            assert torch.equal(x, y), f"step {step}: gradient {i}"
        for i, (x, y) in enumerate(zip(a["buffers"], b["buffers"], strict=True)):
            assert torch.equal(x, y), f"step {step}: buffer {i}"


def largest_block(model: nn.Module, x: torch.Tensor) -> int:
    """Bytes of the largest block call of one step (measured on a copy)."""
    probe = copy.deepcopy(model)
    tracker = BlockDTR(probe, "100%")
    probe(x).backward()
    return int(tracker.summary()["largest_block"])
