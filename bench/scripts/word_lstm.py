"""A word-level LSTM language model trained with a hand-written SGD update,
truncated backpropagation through time and gradient clipping, in the style of
the classic word language model example; the corpus is synthetic (sentences
from a tiny seeded grammar). At the end the whole model is saved with
``torch.save(model, f)``, as that example does.

    python word_lstm.py --save-dir DIR [--epochs 2] [--bptt 12]
"""

import argparse
import math
import os

import torch
import torch.nn as nn


class Corpus:
    def __init__(self, n_sentences, seed):
        g = torch.Generator().manual_seed(seed)
        subjects = ["the cat", "a dog", "my friend", "the old man", "a bird"]
        verbs = ["sees", "likes", "follows", "finds", "hears"]
        objects = ["the ball", "a tree", "the river", "a house", "the moon", "some bread"]
        words = []
        for _ in range(n_sentences):
            pick = lambda xs: xs[int(torch.randint(0, len(xs), (1,), generator=g))]  # noqa: E731
            words += (pick(subjects) + " " + pick(verbs) + " " + pick(objects) + " <eos>").split()
        self.vocab = sorted(set(words))
        index = {w: i for i, w in enumerate(self.vocab)}
        self.ids = torch.tensor([index[w] for w in words], dtype=torch.long)


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    return data[: nbatch * bsz].view(bsz, -1).t().contiguous()


def get_batch(source, i, bptt):
    seq_len = min(bptt, len(source) - 1 - i)
    return source[i : i + seq_len], source[i + 1 : i + 1 + seq_len].reshape(-1)


class RNNModel(nn.Module):
    def __init__(self, ntoken, ninp, nhid, nlayers, dropout=0.2):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        self.nhid, self.nlayers = nhid, nlayers
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output).view(-1, self.decoder.out_features)
        return nn.functional.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, bsz, self.nhid), weight.new_zeros(self.nlayers, bsz, self.nhid))


def repackage_hidden(h):
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


def evaluate(model, criterion, source, bptt, bsz):
    model.eval()
    total = 0.0
    hidden = model.init_hidden(bsz)
    with torch.no_grad():
        for i in range(0, source.size(0) - 1, bptt):
            data, targets = get_batch(source, i, bptt)
            output, hidden = model(data, hidden)
            hidden = repackage_hidden(hidden)
            total += len(data) * criterion(output, targets).item()
    return total / (len(source) - 1)


def main():
    parser = argparse.ArgumentParser(description="word-level LSTM language model, hand-written SGD")
    parser.add_argument("--emsize", type=int, default=32)
    parser.add_argument("--nhid", type=int, default=64)
    parser.add_argument("--nlayers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=20.0)
    parser.add_argument("--clip", type=float, default=0.25)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--bptt", type=int, default=12)
    parser.add_argument("--sentences", type=int, default=60)
    parser.add_argument("--save-dir", default=".")
    args = parser.parse_args()
    torch.manual_seed(1111)

    corpus = Corpus(args.sentences, 0)
    train_data = batchify(corpus.ids, args.batch_size)
    val_data = batchify(Corpus(20, 1).ids, 4)
    model = RNNModel(len(corpus.vocab), args.emsize, args.nhid, args.nlayers)
    criterion = nn.NLLLoss()
    lr, best_val = args.lr, None
    for epoch in range(1, args.epochs + 1):
        model.train()
        hidden = model.init_hidden(args.batch_size)
        for batch, i in enumerate(range(0, train_data.size(0) - 1, args.bptt)):
            data, targets = get_batch(train_data, i, args.bptt)
            hidden = repackage_hidden(hidden)
            model.zero_grad()
            output, hidden = model(data, hidden)
            loss = criterion(output, targets)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-lr)
            print(f"| epoch {epoch} | batch {batch} | lr {lr} | loss {loss.item()!r} | ppl {math.exp(loss.item())!r}")
        val_loss = evaluate(model, criterion, val_data, args.bptt, 4)
        print(f"| end of epoch {epoch} | valid loss {val_loss!r}")
        if best_val is None or val_loss < best_val:
            with open(os.path.join(args.save_dir, "model.pt"), "wb") as f:
                torch.save(model, f)
            best_val = val_loss
        else:
            lr /= 4.0


if __name__ == "__main__":
    main()
