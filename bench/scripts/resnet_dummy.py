"""A ResNet trained on dummy data, in the style of the ImageNet example run
with ``--dummy``: a residual network (basic blocks, batch normalization),
SGD with momentum and a StepLR schedule, top-1/top-5 accuracy under no_grad,
a progress line per batch, validation, and a checkpoint with the model's and
the optimizer's state. Small images and widths for a CPU.

    python resnet_dummy.py --save-dir DIR [--epochs 2] [-b 16]
"""

import argparse
import os
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet(nn.Module):
    def __init__(self, layers=(2, 2, 2), width=16, num_classes=20):
        super().__init__()
        self.inplanes = width
        self.conv1 = nn.Conv2d(3, width, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        stages = []
        for i, blocks in enumerate(layers):
            stages.append(self._make_layer(width * 2**i, blocks, stride=1 if i == 0 else 2))
        self.layers = nn.Sequential(*stages)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(self.inplanes, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def _make_layer(self, planes, blocks, stride):
        layers = [BasicBlock(self.inplanes, planes, stride)]
        self.inplanes = planes
        layers += [BasicBlock(planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.layers(self.relu(self.bn1(self.conv1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def accuracy(output, target, topk=(1,)):
    with torch.no_grad():
        maxk = max(topk)
        _, pred = output.topk(maxk, 1, True, True)
        correct = pred.t().eq(target.view(1, -1).expand_as(pred.t()))
        return [correct[:k].reshape(-1).float().sum(0, keepdim=True).mul_(100.0 / target.size(0)) for k in topk]


def dummy(n, seed, classes=20):
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, classes, (n,), generator=g))


def main():
    parser = argparse.ArgumentParser(description="ResNet on dummy data")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("-b", "--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--train-size", type=int, default=48)
    parser.add_argument("--save-dir", default=".")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = ResNet()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=0.9, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.1)
    train_loader = DataLoader(dummy(args.train_size, 0), batch_size=args.batch_size, shuffle=True,
                              generator=torch.Generator().manual_seed(0))
    val_loader = DataLoader(dummy(32, 1), batch_size=args.batch_size)
    best_acc1 = 0.0
    for epoch in range(args.epochs):
        model.train()
        end = time.time()
        for i, (images, target) in enumerate(train_loader):
            output = model(images)
            loss = criterion(output, target)
            acc1, acc5 = accuracy(output, target, topk=(1, 5))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            batch_time, end = time.time() - end, time.time()  # not printed: the output is compared
            print(f"Epoch: [{epoch}][{i}/{len(train_loader)}] Loss {loss.item()!r} "
                  f"Acc@1 {acc1[0]:6.2f} Acc@5 {acc5[0]:6.2f}")
        model.eval()
        top1 = 0.0
        with torch.no_grad():
            for images, target in val_loader:
                top1 += accuracy(model(images), target)[0].item() * images.size(0)
        acc1 = top1 / len(val_loader.dataset)
        print(f" * Acc@1 {acc1!r}")
        scheduler.step()
        is_best = acc1 >= best_acc1
        best_acc1 = max(acc1, best_acc1)
        state = {"epoch": epoch + 1, "state_dict": model.state_dict(), "best_acc1": best_acc1,
                 "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
        torch.save(state, os.path.join(args.save_dir, "checkpoint.pth.tar"))
        if is_best:
            torch.save(state, os.path.join(args.save_dir, "model_best.pth.tar"))


if __name__ == "__main__":
    main()
