"""A DCGAN on synthetic 16x16 images (colored blobs), in the style of the
DCGAN example: a transposed-convolution generator and a convolutional
discriminator with batch normalization, two Adam optimizers, the
discriminator trained on a real and a fake batch, then the generator; every
few iterations the generator draws fixed noise (with gradients enabled, as the
example does) and the samples are saved with the checkpoints.

    python dcgan.py --save-dir DIR [--niter 2] [--batch-size 16]
"""

import argparse
import os

import torch
import torch.nn as nn
import torch.optim as optim
from torch.utils.data import DataLoader, TensorDataset

nz, ngf, ndf, nc = 16, 16, 16, 3


def weights_init(m):
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        torch.nn.init.normal_(m.weight, 0.0, 0.02)
    elif classname.find("BatchNorm") != -1:
        torch.nn.init.normal_(m.weight, 1.0, 0.02)
        torch.nn.init.zeros_(m.bias)


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, ngf * 2, 4, 1, 0, bias=False),
            nn.BatchNorm2d(ngf * 2),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ngf),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf, nc, 4, 2, 1, bias=False),
            nn.Tanh(),
        )

    def forward(self, input):
        return self.main(input)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(nc, ndf, 4, 2, 1, bias=False),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ndf * 2),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 2, 1, 4, 1, 0, bias=False),
            nn.Sigmoid(),
        )

    def forward(self, input):
        return self.main(input).view(-1, 1).squeeze(1)


def blobs(n, seed):
    g = torch.Generator().manual_seed(seed)
    ys, xs = torch.meshgrid(torch.arange(16.0), torch.arange(16.0), indexing="ij")
    centers = torch.rand(n, 2, generator=g) * 10 + 3
    colors = torch.rand(n, nc, 1, 1, generator=g) * 2 - 1
    d2 = (ys - centers[:, 0, None, None]) ** 2 + (xs - centers[:, 1, None, None]) ** 2
    return TensorDataset(colors * torch.exp(-d2 / 8.0)[:, None])


def main():
    parser = argparse.ArgumentParser(description="DCGAN on synthetic blobs")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--niter", type=int, default=2)
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.0002)
    parser.add_argument("--sample-every", type=int, default=2)
    parser.add_argument("--save-dir", default=".")
    args = parser.parse_args()
    torch.manual_seed(999)

    loader = DataLoader(blobs(args.images, 0), batch_size=args.batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    netG, netD = Generator(), Discriminator()
    netG.apply(weights_init)
    netD.apply(weights_init)
    criterion = nn.BCELoss()
    fixed_noise = torch.randn(8, nz, 1, 1)
    real_label, fake_label = 1.0, 0.0
    optimizerD = optim.Adam(netD.parameters(), lr=args.lr, betas=(0.5, 0.999))
    optimizerG = optim.Adam(netG.parameters(), lr=args.lr, betas=(0.5, 0.999))
    samples = []
    for epoch in range(args.niter):
        for i, (real,) in enumerate(loader):
            # (1) Update D: maximize log(D(x)) + log(1 - D(G(z)))
            netD.zero_grad()
            batch_size = real.size(0)
            label = torch.full((batch_size,), real_label)
            output = netD(real)
            errD_real = criterion(output, label)
            errD_real.backward()
            D_x = output.mean().item()
            noise = torch.randn(batch_size, nz, 1, 1)
            fake = netG(noise)
            label.fill_(fake_label)
            output = netD(fake.detach())
            errD_fake = criterion(output, label)
            errD_fake.backward()
            D_G_z1 = output.mean().item()
            errD = errD_real + errD_fake
            optimizerD.step()
            # (2) Update G: maximize log(D(G(z)))
            netG.zero_grad()
            label.fill_(real_label)
            output = netD(fake)
            errG = criterion(output, label)
            errG.backward()
            D_G_z2 = output.mean().item()
            optimizerG.step()
            print(f"[{epoch}/{args.niter}][{i}/{len(loader)}] Loss_D: {errD.item()!r} Loss_G: {errG.item()!r} "
                  f"D(x): {D_x!r} D(G(z)): {D_G_z1!r} / {D_G_z2!r}")
            if i % args.sample_every == 0:
                fake = netG(fixed_noise)
                samples.append(fake.detach())
        torch.save(netG.state_dict(), os.path.join(args.save_dir, f"netG_epoch_{epoch}.pth"))
        torch.save(netD.state_dict(), os.path.join(args.save_dir, f"netD_epoch_{epoch}.pth"))
    torch.save(torch.stack(samples), os.path.join(args.save_dir, "fake_samples.pt"))


if __name__ == "__main__":
    main()
