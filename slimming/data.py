"""Datasets: CIFAR-10/100 (torchvision), an ImageFolder of 32x32 images, and a synthetic task.

Training batches get a random 32x32 crop of the 4-pixel zero-padded image and a horizontal
flip; every batch is normalised per channel. Imports torchvision only when called.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

DATASETS = ("cifar10", "cifar100", "imagefolder", "synthetic")
# Per-channel mean and std of the CIFAR training images (as in the paper's code); the
# imagefolder and synthetic datasets use CIFAR-10's: BN makes the exact values matter little.
STATS = {"cifar10": ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),
         "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762))}


class DataError(ValueError):
    """A dataset that cannot be read as asked; the message is one line meant for the user."""


def default_root() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "slimming" / "data"


def transforms(name: str, train: bool, from_pil: bool):
    from torchvision.transforms import v2

    mean, std = STATS.get(name, STATS["cifar10"])
    ops = [v2.ToImage()] if from_pil else []
    if train:
        ops += [v2.RandomCrop(32, padding=4), v2.RandomHorizontalFlip()]
    ops += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std)]
    return v2.Compose(ops)


class TensorImages(Dataset):
    """Images held in memory as a uint8 tensor (N, 3, H, W) with int64 labels (N,)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, transform=None):
        self.images, self.labels, self.transform = images, labels, transform
        self.classes = [str(c) for c in range(int(labels.max()) + 1)]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        x = self.images[i]
        return (self.transform(x) if self.transform else x), int(self.labels[i])


def synthetic_images(n: int, num_classes: int = 10, seed: int = 0, split_seed: int = 0):
    """A small learnable 32x32 task: each class is a smooth random colour pattern, each image
    that pattern at a random brightness plus strong pixel noise. Returns uint8 images, labels.

    ``seed`` fixes the class patterns (the task); ``split_seed`` the images drawn from it.
    """
    g = torch.Generator().manual_seed(seed)
    coarse = torch.randn(num_classes, 3, 4, 4, generator=g)
    patterns = torch.nn.functional.interpolate(coarse, size=32, mode="bilinear", align_corners=False)
    g = torch.Generator().manual_seed(10_000 + split_seed)
    labels = torch.randint(num_classes, (n,), generator=g)
    scale = 0.6 + 0.8 * torch.rand(n, 1, 1, 1, generator=g)
    x = patterns[labels] * scale + 4 * torch.randn(n, 3, 32, 32, generator=g)
    images = (128 + 40 * x).clamp(0, 255).to(torch.uint8)
    return images, labels


def _imagefolder(root: Path, split: str, transform):
    from torchvision.datasets import ImageFolder

    folder = root / split
    if not folder.is_dir():
        raise DataError(f"{root}: expected the layout {split}/<class>/<image> (no {split}/ folder)")
    try:
        ds = ImageFolder(str(folder), transform=transform)
    except (FileNotFoundError, OSError) as e:  # also an empty class folder
        raise DataError(f"{folder}: {str(e).splitlines()[0]}") from None
    from PIL import Image

    with Image.open(ds.samples[0][0]) as im:
        if im.size != (32, 32):
            raise DataError(f"{folder}: images must be 32x32 for these networks, found "
                            f"{im.size[0]}x{im.size[1]}; resize them first")
    return ds


def build_datasets(name: str, root: str | os.PathLike | None = None, download: bool = False):
    """(train set, test set, number of classes) for dataset ``name`` under ``root``."""
    if name not in DATASETS:
        raise DataError(f"unknown dataset {name!r}; choose one of: {', '.join(DATASETS)}")
    if name == "synthetic":
        train = TensorImages(*synthetic_images(2560, split_seed=1), transforms(name, True, False))
        test = TensorImages(*synthetic_images(512, split_seed=2), transforms(name, False, False))
        return train, test, 10
    if root is None:
        if name == "imagefolder":
            raise DataError("--dataset imagefolder needs --data-root DIR holding train/ and test/")
        root = default_root()
    root = Path(root)
    if name == "imagefolder":
        train = _imagefolder(root, "train", transforms(name, True, True))
        test = _imagefolder(root, "test", transforms(name, False, True))
        if train.classes != test.classes:
            raise DataError(f"{root}: train/ and test/ hold different class folders")
        return train, test, len(train.classes)
    from torchvision import datasets

    cls = datasets.CIFAR10 if name == "cifar10" else datasets.CIFAR100
    try:
        train = cls(str(root), train=True, download=download, transform=transforms(name, True, True))
        test = cls(str(root), train=False, download=download, transform=transforms(name, False, True))
    except RuntimeError:
        raise DataError(f"{name} not found under {root}: pass --download to fetch it, point "
                        "--data-root at a folder that holds it, or use --dataset imagefolder "
                        "--data-root DIR (a local copy) or --dataset synthetic") from None
    except OSError as e:  # a download that cannot reach the network
        raise DataError(f"{name}: download failed ({str(e).splitlines()[0]}); point --data-root "
                        "at a local copy or use --dataset imagefolder or synthetic") from None
    return train, test, len(train.classes)


def build_loaders(name: str, root=None, batch_size: int = 64, workers: int = 0,
                  download: bool = False, seed: int | None = None, pin_memory: bool = False):
    """(train loader, test loader, number of classes). The train loader shuffles with a
    generator seeded from ``seed`` so that a seeded run sees the same batches."""
    train, test, num_classes = build_datasets(name, root, download)
    g = torch.Generator()
    g.manual_seed(seed if seed is not None else torch.seed())
    common = dict(num_workers=workers, pin_memory=pin_memory, persistent_workers=workers > 0)
    train_loader = DataLoader(train, batch_size=batch_size, shuffle=True, generator=g,
                              drop_last=False, **common)
    test_loader = DataLoader(test, batch_size=max(256, batch_size), shuffle=False, **common)
    return train_loader, test_loader, num_classes
