"""Time sequence prediction: two stacked LSTM cells learn sine waves with
LBFGS (a closure optimizer), in double precision, then predict the future
under no_grad - in the style of the time sequence prediction example, with
the waves generated here instead of read from a file.

    python lbfgs_sine.py --save-dir DIR [--steps 3]
"""

import argparse
import os

import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim


class Sequence(nn.Module):
    def __init__(self, hidden=24):
        super().__init__()
        self.hidden = hidden
        self.lstm1 = nn.LSTMCell(1, hidden)
        self.lstm2 = nn.LSTMCell(hidden, hidden)
        self.linear = nn.Linear(hidden, 1)

    def forward(self, input, future=0):
        outputs = []
        n = input.size(0)
        h_t = torch.zeros(n, self.hidden, dtype=torch.double)
        c_t = torch.zeros(n, self.hidden, dtype=torch.double)
        h_t2 = torch.zeros(n, self.hidden, dtype=torch.double)
        c_t2 = torch.zeros(n, self.hidden, dtype=torch.double)
        for input_t in input.split(1, dim=1):
            h_t, c_t = self.lstm1(input_t, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        for _ in range(future):
            h_t, c_t = self.lstm1(output, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        return torch.cat(outputs, dim=1)


def make_waves(n, length, period=20):
    rng = np.random.RandomState(2)
    x = np.empty((n, length), np.int64)
    x[:] = np.arange(length) + rng.randint(-4 * period, 4 * period, n).reshape(n, 1)
    return torch.from_numpy(np.sin(x / 1.0 / period).astype("float64"))


def main():
    parser = argparse.ArgumentParser(description="LSTM sine waves with LBFGS")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--length", type=int, default=40)
    parser.add_argument("--waves", type=int, default=12)
    parser.add_argument("--save-dir", default=".")
    args = parser.parse_args()
    np.random.seed(0)
    torch.manual_seed(0)
    data = make_waves(args.waves, args.length)
    input, target = data[3:, :-1], data[3:, 1:]
    test_input, test_target = data[:3, :-1], data[:3, 1:]
    seq = Sequence().double()
    criterion = nn.MSELoss()
    optimizer = optim.LBFGS(seq.parameters(), lr=0.8, max_iter=4)
    for i in range(args.steps):
        print("STEP:", i)

        def closure():
            optimizer.zero_grad()
            out = seq(input)
            loss = criterion(out, target)
            print("loss:", repr(loss.item()))
            loss.backward()
            return loss

        optimizer.step(closure)
        with torch.no_grad():
            future = 10
            pred = seq(test_input, future=future)
            loss = criterion(pred[:, :-future], test_target)
            print("test loss:", repr(loss.item()))
        torch.save({"pred": pred, "state_dict": seq.state_dict()}, os.path.join(args.save_dir, f"predict{i}.pt"))


if __name__ == "__main__":
    main()
