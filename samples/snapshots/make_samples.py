"""Make the sample PyTorch memory snapshots in samples/snapshots/.

No GPU was available, so the runs are recorded on the CPU with
memscale.record_snapshot(device="cpu"): torch.profiler(profile_memory=True)
reports every allocation and free of the CPU allocator (address, size, op),
written in the pickle format of torch.cuda.memory._dump_snapshot (see
pytorch_plugin/memscale/record.py). Seeds are fixed; the addresses differ from
run to run, the sizes and order do not.

    PYTHONPATH=pytorch_plugin .venv/bin/python samples/snapshots/make_samples.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import memscale

HERE = Path(__file__).resolve().parent


def mlp(steps: int = 4) -> None:
    """A 4-layer MLP (1024 wide), batch 256, Adam: 4 training steps."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 1024), torch.nn.GELU(),
        torch.nn.Linear(1024, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 10),
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(256, 512), torch.randint(0, 10, (256,))
    with memscale.record_snapshot(HERE / "mlp-train.pickle", device="cpu"):
        for _ in range(steps):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()


def gpt2(steps: int = 3) -> None:
    """GPT-2 (transformers), 2 layers, 256 wide, 4 heads, batch 4 x 128 tokens, AdamW: 3 steps."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=256, n_head=4, n_positions=128, vocab_size=8192,
                     attn_pdrop=0.0, embd_pdrop=0.0, resid_pdrop=0.0,
                     bos_token_id=0, eos_token_id=0)
    cfg._attn_implementation = "eager"
    model = GPT2LMHeadModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, cfg.vocab_size, (4, 128))
    with memscale.record_snapshot(HERE / "gpt2-train.pickle", device="cpu"):
        for _ in range(steps):
            loss = model(ids, labels=ids).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()


if __name__ == "__main__":
    which = sys.argv[1:] or ["mlp", "gpt2"]
    for name in which:
        {"mlp": mlp, "gpt2": gpt2}[name]()
        print(f"wrote {HERE / (name + '-train.pickle')}")
