"""A Lightning Trainer run twice: plainly, then with ``memscale.wrap(trainer,
Config(mode="balanced"))`` (the first step measures the peak, later steps run
at 75 % of it): a small GPT-2 on random tokens, 4 AdamW steps.

    python lightning_wrap.py OUT.pt WORKDIR

Writes both runs' losses and final parameters and memscale's summary to OUT.pt.
"""

import sys

import torch

import memscale
from lit_gpt2 import LitGPT2, data, trainer

out_path, workdir = sys.argv[1], sys.argv[2]


def fit(wrap: bool):
    torch.manual_seed(0)
    module = LitGPT2()
    fitter = trainer(workdir)
    if wrap:
        memscale.wrap(fitter, memscale.Config(mode="balanced", log_summary=False))
    fitter.fit(module, data())
    summary = memscale.summary(memscale.detach(fitter)).as_dict() if wrap else None
    return {
        "losses": module.losses,
        "params": {k: v.clone() for k, v in module.state_dict().items()},
        "summary": summary,
    }


torch.save({"plain": fit(False), "memscale": fit(True)}, out_path)
