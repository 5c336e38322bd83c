"""A Lightning Trainer run (no memscale in it): a small GPT-2 on random tokens,
4 optimizer steps with AdamW; Lightning passes a closure (forward + backward) to
``optimizer.step``.

    python lightning_trainer.py OUT.pt WORKDIR

Writes the losses and the final parameters to OUT.pt.
"""

import sys

import torch

from lit_gpt2 import LitGPT2, data, trainer

out_path, workdir = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
module = LitGPT2()
trainer(workdir).fit(module, data())
torch.save({"losses": module.losses, "params": dict(module.state_dict())}, out_path)
