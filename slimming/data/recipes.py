"""What a batch is, shared by every part of the input pipeline: the per-channel constants
(CIFAR's, ImageNet's), the default image sizes, the two per-image recipes as torchvision v2
pipelines (``make_transform``: pad-and-crop for images that are NxN already, resized crops for
any others; ``padding_for``, ``resize_for``), and ``DataInfo``, the record of which recipe, size
and normalisation made a run's batches (stored in checkpoints).

Its own module because the loaders, the image-folder code and the entry points in
``slimming.data`` all need these, and a lower module they all import is what keeps the three
free of import circles. Layering: ``recipes`` <- ``loaders``, ``imagefolder`` <- ``data``; this
module imports none of them. Imports torchvision only when a pipeline is made.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

# Per-channel mean and std of the CIFAR training images (as in the paper's code); the synthetic
# dataset uses CIFAR-10's: BN makes the exact values matter little. An image folder's are measured.
STATS = {"cifar10": ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),
         "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762))}
IMAGENET_STATS = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
PADDING = 4  # RandomCrop(32, padding=4): padding_for(32)
SMALL_SIZE, LARGE_SIZE = 32, 224  # the default image size: 32 when every image is 32x32, else 224


def padding_for(image_size: int) -> int:
    """The zero padding of the pad-and-crop recipe: N // 8 (4 for 32x32), at least 1."""
    return max(1, image_size // 8)


def resize_for(image_size: int) -> int:
    """The shorter side an image is resized to before the centre NxN crop: round(N * 8 / 7)."""
    return round(image_size * 8 / 7)


def make_transform(image_size: int, resize: int | None, mean: Sequence[float], std: Sequence[float],
                   train: bool, from_pil: bool = False, normalize: bool = True):
    """The torchvision v2 pipeline for one image (a uint8 tensor (3, H, W), or a PIL image with
    ``from_pil``) -> float32 (3, N, N), N = ``image_size``. ``resize`` None: the image is NxN
    already; training pads and crops it (``padding_for(N)``) and flips it, evaluation leaves it.
    Otherwise training is ``RandomResizedCrop(N)`` + flip, evaluation resizes the shorter side to
    ``resize`` and crops the centre NxN. ``normalize=False`` stops at the uint8 image."""
    from torchvision.transforms import v2

    ops = [v2.ToImage()] if from_pil else []
    if resize is None:
        if train:
            ops += [v2.RandomCrop(image_size, padding=padding_for(image_size)), v2.RandomHorizontalFlip()]
    elif train:
        ops += [v2.RandomResizedCrop(image_size, antialias=True), v2.RandomHorizontalFlip()]
    else:
        ops += [v2.Resize(resize, antialias=True), v2.CenterCrop(image_size)]
    if normalize:
        ops += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(list(mean), list(std))]
    return v2.Compose(ops)


def transforms(name: str, train: bool, from_pil: bool):
    """The 32x32 pipeline of dataset ``name`` with its constant mean and std (CIFAR-10's for any
    but cifar100): pad-and-crop + flip for training."""
    mean, std = STATS.get(name, STATS["cifar10"])
    return make_transform(SMALL_SIZE, None, mean, std, train, from_pil)


@dataclass(frozen=True)
class DataInfo:
    """How the batches were made, as a caller must know to store it in a checkpoint and to feed
    a trained network the same inputs later (``as_dict()`` holds only plain values).

    ``image_size``: N, batches are (B, 3, N, N). ``resize``: None when every image is NxN and is
    used as it is (training: pad by ``padding`` and crop, flip); else the shorter side evaluation
    resizes to before the centre NxN crop (training: RandomResizedCrop(N), flip). ``mean``,
    ``std``: the per-channel normalisation, from ``norm`` ("dataset": the training images',
    "imagenet", or "given": passed in). ``loader``: "fast" or "torchvision", the one serving the
    batches. ``test_split``: the folder read as the test split ("test", or "val" for an image
    folder without test/)."""

    image_size: int
    resize: int | None
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    norm: str
    loader: str
    test_split: str = "test"

    @property
    def padding(self) -> int:
        return padding_for(self.image_size)

    def as_dict(self) -> dict:
        return {"image_size": self.image_size, "resize": self.resize, "mean": list(self.mean),
                "std": list(self.std), "norm": self.norm}

    def transform(self, train: bool = False, from_pil: bool = False):
        """The per-image pipeline (``make_transform``) these batches were made with: for
        evaluation or inference on new images, ``info.transform(from_pil=True)(pil_image)``."""
        return make_transform(self.image_size, self.resize, self.mean, self.std, train, from_pil)
