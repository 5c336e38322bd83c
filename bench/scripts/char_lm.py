"""A character-level language model: a GRU over one-hot characters trained
with Adam and gradient clipping on synthetic text (a seeded Markov chain over
a small alphabet), sampling a line from the model after every epoch, in the
style of the char-RNN tutorials.

    python char_lm.py --save-dir DIR [--epochs 2] [--seq-len 32]
"""

import argparse
import os

import torch
import torch.nn as nn

ALPHABET = "abcdefghij ."


def make_text(n, seed):
    g = torch.Generator().manual_seed(seed)
    trans = torch.rand(len(ALPHABET), len(ALPHABET), generator=torch.Generator().manual_seed(7)) ** 4
    trans = trans / trans.sum(1, keepdim=True)
    state, out = 0, []
    for _ in range(n):
        state = int(torch.multinomial(trans[state], 1, generator=g))
        out.append(state)
    return torch.tensor(out, dtype=torch.long)


class CharRNN(nn.Module):
    def __init__(self, vocab, hidden=96, layers=2):
        super().__init__()
        self.vocab = vocab
        self.rnn = nn.GRU(vocab, hidden, layers, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, x, h=None):
        out, h = self.rnn(nn.functional.one_hot(x, self.vocab).float(), h)
        return self.head(out), h


def sample(model, length, seed):
    g = torch.Generator().manual_seed(seed)
    x, h, chars = torch.zeros(1, 1, dtype=torch.long), None, []
    with torch.no_grad():
        for _ in range(length):
            logits, h = model(x, h)
            x = torch.multinomial(torch.softmax(logits[:, -1], -1), 1, generator=g)
            chars.append(ALPHABET[int(x)])
    return "".join(chars)


def main():
    parser = argparse.ArgumentParser(description="char-level GRU language model")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--chars", type=int, default=2048)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--save-dir", default=".")
    args = parser.parse_args()
    torch.manual_seed(42)
    text = make_text(args.chars, 0)
    n = (len(text) - 1) // args.seq_len
    inputs = text[: n * args.seq_len].view(n, args.seq_len)
    targets = text[1 : n * args.seq_len + 1].view(n, args.seq_len)
    model = CharRNN(len(ALPHABET))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    criterion = nn.CrossEntropyLoss()
    step = 0
    for epoch in range(args.epochs):
        order = torch.randperm(n, generator=torch.Generator().manual_seed(epoch))
        for b in range(0, n - args.batch_size + 1, args.batch_size):
            idx = order[b : b + args.batch_size]
            logits, _ = model(inputs[idx])
            loss = criterion(logits.reshape(-1, len(ALPHABET)), targets[idx].reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            if step % 2 == 0:
                print(f"step {step}: loss {loss.item()!r}")
            step += 1
        print(f"epoch {epoch} sample: {sample(model, 40, epoch)!r}")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
               os.path.join(args.save_dir, "ckpt.pt"))


if __name__ == "__main__":
    main()
