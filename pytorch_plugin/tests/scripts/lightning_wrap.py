"""A Lightning Trainer run twice: plainly, then with ``memscale.wrap(trainer,
Config(mode="balanced"))`` (the first step measures the peak, later steps run
at 75 % of it): a small GPT-2 on random tokens, 4 AdamW steps.

    python lightning_wrap.py OUT.pt WORKDIR

Writes both runs' losses and final parameters and memscale's summary to OUT.pt.
"""

import sys

import pytorch_lightning as pl
import torch
import transformers

import memscale

out_path, workdir = sys.argv[1], sys.argv[2]
transformers.logging.set_verbosity_error()
config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=64, vocab_size=256)
data = torch.Generator().manual_seed(1)
batches = [torch.randint(0, 256, (4, 64), generator=data) for _ in range(4)]


class LitGPT2(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.model = transformers.GPT2LMHeadModel(config)
        self.losses = []

    def training_step(self, batch, batch_idx):
        loss = self.model(input_ids=batch, labels=batch).loss
        self.losses.append(loss.detach().clone())
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def fit(wrap: bool):
    torch.manual_seed(0)
    module = LitGPT2()
    trainer = pl.Trainer(
        max_steps=4,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=workdir,
    )
    if wrap:
        memscale.wrap(trainer, memscale.Config(mode="balanced", log_summary=False))
    trainer.fit(module, torch.utils.data.DataLoader(batches, batch_size=None))
    summary = memscale.detach(trainer) and memscale.summary(trainer).as_dict() if wrap else None
    return {"losses": module.losses, "params": {k: v.clone() for k, v in module.state_dict().items()}, "summary": summary}


torch.save({"plain": fit(False), "memscale": fit(True)}, out_path)
