"""An MNIST-style CNN trained with Adadelta and a StepLR schedule, on synthetic
28x28 digits (a fixed random template per class plus noise), CPU only.

    python mnist_adadelta.py --save-dir DIR [--epochs 2] [--batch-size 32]
"""

import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, 1)
        self.conv2 = nn.Conv2d(8, 16, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(16 * 12 * 12, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return F.log_softmax(self.fc2(x), dim=1)


def synthetic_digits(n, seed):
    g = torch.Generator().manual_seed(seed)
    templates = torch.rand(10, 1, 28, 28, generator=torch.Generator().manual_seed(1234))
    labels = torch.randint(0, 10, (n,), generator=g)
    images = templates[labels] + 0.3 * torch.randn(n, 1, 28, 28, generator=g)
    return TensorDataset((images - 0.5) / 0.3, labels)


def train(args, model, loader, optimizer, epoch):
    model.train()
    for batch_idx, (data, target) in enumerate(loader):
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        if batch_idx % args.log_interval == 0:
            print(f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(loader.dataset)}]\tLoss: {loss.item()!r}")


def test(model, loader):
    model.eval()
    test_loss, correct = 0.0, 0
    with torch.no_grad():
        for data, target in loader:
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            correct += output.argmax(dim=1).eq(target).sum().item()
    test_loss /= len(loader.dataset)
    print(f"Test set: Average loss: {test_loss!r}, Accuracy: {correct}/{len(loader.dataset)}")


def main():
    parser = argparse.ArgumentParser(description="MNIST-style CNN, Adadelta")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--gamma", type=float, default=0.7)
    parser.add_argument("--train-size", type=int, default=128)
    parser.add_argument("--log-interval", type=int, default=1)
    parser.add_argument("--save-dir", default=".")
    args = parser.parse_args()
    torch.manual_seed(1)

    train_loader = DataLoader(
        synthetic_digits(args.train_size, 0), batch_size=args.batch_size, shuffle=True,
        generator=torch.Generator().manual_seed(0),
    )
    test_loader = DataLoader(synthetic_digits(64, 1), batch_size=64)
    model = Net()
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    for epoch in range(1, args.epochs + 1):
        train(args, model, train_loader, optimizer, epoch)
        test(model, test_loader)
        scheduler.step()
    torch.save(model.state_dict(), os.path.join(args.save_dir, "mnist_cnn.pt"))


if __name__ == "__main__":
    main()
