"""A memscale 0.1 user's script, unchanged: the 0.1 API (OptimizationMode,
Config with the 0.1 names, wrap(model, config, sample_input), optimize(model),
detach) on a small MLP on the CPU.

    python v01_example.py OUT.pt LOG_FILE

Writes the losses of a plain run and of the memscale runs, the summaries and
the metrics text scraped from the observability port to OUT.pt.
"""

import sys
import urllib.request

import torch

import memscale
from memscale import Config, OptimizationMode

out_path, log_file = sys.argv[1], sys.argv[2]


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        *[m for _ in range(6) for m in (torch.nn.Linear(128, 128), torch.nn.Tanh())], torch.nn.Linear(128, 1)
    )


def batches():
    g = torch.Generator().manual_seed(1)
    return [torch.randn(1024, 128, generator=g) for _ in range(4)]


def train(model, optimizer):
    losses = []
    for x in batches():
        loss = model(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach().clone())
    return losses


plain_model = make_model()
plain = train(plain_model, torch.optim.SGD(plain_model.parameters(), lr=0.05))

config = Config(
    mode=OptimizationMode.BALANCED,
    enable_checkpointing=True,
    enable_offloading=True,
    max_cpu_offload_gb=0.0005,  # about 0.5 MiB of swapped tensors at most
    warmup_steps=1,
    log_file=log_file,
    observability_port=0,
)
model = make_model()
model = memscale.wrap(model, config, batches()[0])
wrapped = train(model, torch.optim.SGD(model.parameters(), lr=0.05))
from memscale import metrics

port = next(iter(metrics._servers.values()))[0]
scraped = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
wrapped_summary = memscale.summary(model).as_dict()
memscale.detach(model)
memscale.detach(model)  # not wrapped any more: a warning, as in 0.1

model = make_model()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
with memscale.optimize(model, config=Config(mode="balanced", log_summary=False)) as run:
    optimized = train(model, optimizer)
torch.save(
    {
        "plain": plain,
        "wrapped": wrapped,
        "optimized": optimized,
        "wrapped_summary": wrapped_summary,
        "optimized_summary": run.summary().as_dict(),
        "metrics": scraped,
    },
    out_path,
)
