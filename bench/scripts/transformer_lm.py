"""A Transformer language model (nn.TransformerEncoder with a causal mask,
sinusoidal positions, dropout) trained with AdamW, a linear warmup schedule
and gradient accumulation over micro-batches, evaluated under
torch.inference_mode, in the style of the word language model's Transformer
variant. Synthetic token streams (a seeded second-order Markov chain).

    python transformer_lm.py --save-dir DIR [--steps 6] [--accum 2]
"""

import argparse
import math
import os

import torch
import torch.nn as nn


class PositionalEncoding(nn.Module):
    def __init__(self, d_model, dropout=0.1, max_len=256):
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        pe = torch.zeros(max_len, d_model)
        position = torch.arange(0, max_len, dtype=torch.float).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe.unsqueeze(0))

    def forward(self, x):
        return self.dropout(x + self.pe[:, : x.size(1)])


class TransformerModel(nn.Module):
    def __init__(self, ntoken, d_model=64, nhead=4, d_hid=128, nlayers=2, dropout=0.1):
        super().__init__()
        self.embedding = nn.Embedding(ntoken, d_model)
        self.pos_encoder = PositionalEncoding(d_model, dropout)
        layer = nn.TransformerEncoderLayer(d_model, nhead, d_hid, dropout, batch_first=True)
        self.transformer_encoder = nn.TransformerEncoder(layer, nlayers, enable_nested_tensor=False)
        self.decoder = nn.Linear(d_model, ntoken)
        self.d_model = d_model

    def forward(self, src):
        mask = nn.Transformer.generate_square_subsequent_mask(src.size(1))
        x = self.pos_encoder(self.embedding(src) * math.sqrt(self.d_model))
        return self.decoder(self.transformer_encoder(x, mask=mask, is_causal=True))


def token_stream(n, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    table = torch.randint(0, vocab, (vocab, vocab, 3), generator=torch.Generator().manual_seed(5))
    out = [0, 1]
    for _ in range(n - 2):
        out.append(int(table[out[-2], out[-1], int(torch.randint(0, 3, (1,), generator=g))]))
    return torch.tensor(out)


def main():
    parser = argparse.ArgumentParser(description="Transformer LM with gradient accumulation")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--accum", type=int, default=2)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=48)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--save-dir", default=".")
    args = parser.parse_args()
    torch.manual_seed(0)
    data = token_stream(4096, args.vocab, 0)
    windows = data[: (len(data) - 1) // args.seq_len * args.seq_len + 1]
    n = (len(windows) - 1) // args.seq_len
    model = TransformerModel(args.vocab)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    warmup = 3
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup))
    criterion = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(1)
    for step in range(args.steps):
        model.train()
        optimizer.zero_grad()
        total = 0.0
        for _ in range(args.accum):
            idx = torch.randint(0, n - 1, (args.micro_batch,), generator=g) * args.seq_len
            src = torch.stack([windows[i : i + args.seq_len] for i in idx])
            tgt = torch.stack([windows[i + 1 : i + 1 + args.seq_len] for i in idx])
            loss = criterion(model(src).view(-1, args.vocab), tgt.view(-1)) / args.accum
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        optimizer.step()
        scheduler.step()
        print(f"| step {step:3d} | lr {scheduler.get_last_lr()[0]!r} | loss {total!r}")
        if step % 3 == 2:
            model.eval()
            with torch.inference_mode():
                src = windows[: args.seq_len].unsqueeze(0)
                val = criterion(model(src).view(-1, args.vocab), windows[1 : args.seq_len + 1])
            print(f"| eval | loss {val.item()!r}")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()},
               os.path.join(args.save_dir, "transformer.pt"))


if __name__ == "__main__":
    main()
