"""A plain PyTorch loop (no memscale in it) whose optimizer takes a closure
positionally: LBFGS on an MLP.

    python lbfgs_loop.py OUT.pt [STEPS]
"""

import sys

import torch

out_path = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
torch.manual_seed(0)
layers = []
for _ in range(6):
    layers += [torch.nn.Linear(128, 128), torch.nn.GELU()]
model = torch.nn.Sequential(*layers, torch.nn.Linear(128, 1))
optimizer = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=3)
losses = []
for step in range(steps):
    x = torch.randn(512, 128, generator=torch.Generator().manual_seed(step))

    def closure():
        optimizer.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        return loss

    losses.append(optimizer.step(closure).detach().clone())
torch.save({"losses": losses, "params": dict(model.state_dict())}, out_path)
