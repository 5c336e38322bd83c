"""A plain PyTorch training loop (no memscale in it): a small GPT-2, AdamW,
dropout on, evaluation under no_grad every 2 steps, a checkpoint saved at the end.

    python gpt2_adamw_loop.py OUT.pt [STEPS]

Writes the losses, the gradients of the last step and the final parameters to
OUT.pt, so two runs can be compared bitwise.
"""

import os
import sys

import torch
import transformers

out_path = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
transformers.logging.set_verbosity_error()
torch.manual_seed(0)
config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=64, vocab_size=256)
model = transformers.GPT2LMHeadModel(config)
model.train()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=os.environ.get("FOREACH") == "1")
data = torch.Generator().manual_seed(1)
losses = []
for step in range(steps):
    ids = torch.randint(0, config.vocab_size, (4, 64), generator=data)
    optimizer.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    optimizer.step()
    losses.append(loss.detach().clone())
    if step % 2 == 1:
        model.eval()
        with torch.no_grad():
            eval_loss = model(input_ids=ids, labels=ids).loss
        print(f"step {step}: loss {loss.item():.4f}, eval {eval_loss.item():.4f}")
        model.train()
torch.save({"losses": losses, "grads": grads, "params": dict(model.state_dict())}, out_path)
