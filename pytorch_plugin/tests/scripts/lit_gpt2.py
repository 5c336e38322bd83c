"""The Lightning model, data and Trainer the Lightning scripts share: a small
GPT-2 on random tokens, AdamW, 4 steps on the CPU."""

import pytorch_lightning as pl
import torch
import transformers

transformers.logging.set_verbosity_error()
CONFIG = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=64, vocab_size=256)
_data = torch.Generator().manual_seed(1)
BATCHES = [torch.randint(0, 256, (4, 64), generator=_data) for _ in range(4)]


class LitGPT2(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.model = transformers.GPT2LMHeadModel(CONFIG)
        self.losses = []

    def training_step(self, batch, batch_idx):
        loss = self.model(input_ids=batch, labels=batch).loss
        self.losses.append(loss.detach().clone())
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def trainer(workdir: str) -> pl.Trainer:
    """A quiet 4-step CPU Trainer."""
    return pl.Trainer(
        max_steps=4,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=workdir,
    )


def data() -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(BATCHES, batch_size=None)
