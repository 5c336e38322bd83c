"""A CIFAR-style image classifier: a small CNN trained with SGD (momentum,
weight decay), a cosine schedule, an accuracy meter computed under no_grad
and formatted per batch, and a validation pass per epoch, on synthetic 32x32
color images. The best model's state is saved as a checkpoint dict.

    python vision_cnn.py --save-dir DIR [--epochs 2] [--batch-size 32]
"""

import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(16, 32, 5)
        self.fc1 = nn.Linear(32 * 5 * 5, 96)
        self.fc2 = nn.Linear(96, 64)
        self.fc3 = nn.Linear(64, num_classes)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class AverageMeter:
    def __init__(self, name, fmt=":f"):
        self.name, self.fmt = name, fmt
        self.val = self.avg = self.sum = self.count = 0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count

    def __str__(self):
        return ("{name} {val" + self.fmt + "} ({avg" + self.fmt + "})").format(**self.__dict__)


def accuracy(output, target):
    with torch.no_grad():
        return (output.argmax(1) == target).float().mean() * 100


def images(n, seed):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (n,), generator=g)
    base = torch.randn(10, 3, 32, 32, generator=torch.Generator().manual_seed(99))
    return TensorDataset(base[labels] * 0.5 + torch.randn(n, 3, 32, 32, generator=g), labels)


def main():
    parser = argparse.ArgumentParser(description="CIFAR-style CNN")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--train-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--save-dir", default=".")
    args = parser.parse_args()
    torch.manual_seed(0)
    train_loader = DataLoader(images(args.train_size, 0), batch_size=args.batch_size, shuffle=True,
                              generator=torch.Generator().manual_seed(1))
    val_loader = DataLoader(images(64, 2), batch_size=32)
    net = Net()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs * len(train_loader))
    best_acc = 0.0
    for epoch in range(args.epochs):
        net.train()
        losses, top1 = AverageMeter("Loss", ":.6f"), AverageMeter("Acc@1", ":6.2f")
        for i, (inputs, labels) in enumerate(train_loader):
            outputs = net(inputs)
            loss = criterion(outputs, labels)
            acc = accuracy(outputs, labels)
            losses.update(loss.item(), inputs.size(0))
            top1.update(acc, inputs.size(0))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            print(f"[{epoch + 1}, {i + 1}] {losses} {top1} raw {loss.item()!r}")
        net.eval()
        correct = total = 0
        with torch.no_grad():
            for inputs, labels in val_loader:
                correct += (net(inputs).argmax(1) == labels).sum().item()
                total += labels.size(0)
        val_acc = 100.0 * correct / total
        print(f"epoch {epoch + 1}: val acc {val_acc!r}")
        if val_acc >= best_acc:
            best_acc = val_acc
            torch.save({"epoch": epoch + 1, "state_dict": net.state_dict(), "best_acc": best_acc,
                        "train_acc": top1.avg}, os.path.join(args.save_dir, "best.pth"))


if __name__ == "__main__":
    main()
