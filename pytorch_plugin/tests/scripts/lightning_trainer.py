"""A Lightning Trainer run (no memscale in it): a small GPT-2 on random tokens,
4 optimizer steps with AdamW; Lightning passes a closure (forward + backward) to
``optimizer.step``.

    python lightning_trainer.py OUT.pt WORKDIR

Writes the losses and the final parameters to OUT.pt.
"""

import sys

import pytorch_lightning as pl
import torch
import transformers

out_path, workdir = sys.argv[1], sys.argv[2]
transformers.logging.set_verbosity_error()
torch.manual_seed(0)
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
trainer.fit(module, torch.utils.data.DataLoader(batches, batch_size=None))
torch.save({"losses": module.losses, "params": dict(module.state_dict())}, out_path)
