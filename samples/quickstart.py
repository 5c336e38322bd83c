"""A plain PyTorch training loop (no memscale in it), the README's first example:

    python -m memscale run --threshold 32MiB samples/quickstart.py

An 8-layer MLP, 5 SGD steps on random data; on a GPU when there is one.
"""

import torch

device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
layers = []
for _ in range(8):
    layers += [torch.nn.Linear(512, 512), torch.nn.GELU()]
model = torch.nn.Sequential(*layers, torch.nn.Linear(512, 1)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(5):
    x = torch.randn(1024, 512, device=device)
    loss = model(x).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step}: loss {loss.item():.6f}")
