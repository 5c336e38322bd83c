"""A Hugging Face Trainer run (no memscale in it): a small GPT-2 on random
tokens, 4 optimizer steps, dropout on.

    python hf_trainer.py OUT.pt WORKDIR

Writes the logged losses and the final parameters to OUT.pt.
"""

import sys

import torch
import transformers

out_path, workdir = sys.argv[1], sys.argv[2]
transformers.logging.set_verbosity_error()
torch.manual_seed(0)
config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=64, vocab_size=256)
model = transformers.GPT2LMHeadModel(config)
data = torch.Generator().manual_seed(1)
rows = [{"input_ids": torch.randint(0, 256, (64,), generator=data)} for _ in range(16)]
for row in rows:
    row["labels"] = row["input_ids"].clone()


class Rows(torch.utils.data.Dataset):
    def __len__(self):
        return len(rows)

    def __getitem__(self, i):
        return rows[i]


args = transformers.TrainingArguments(
    output_dir=workdir,
    per_device_train_batch_size=4,
    max_steps=4,
    logging_steps=1,
    save_strategy="no",
    report_to=[],
    use_cpu=True,
    seed=0,
    dataloader_num_workers=0,
    disable_tqdm=True,
)
trainer = transformers.Trainer(model=model, args=args, train_dataset=Rows())
trainer.train()
losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
torch.save({"losses": losses, "params": dict(model.state_dict())}, out_path)
