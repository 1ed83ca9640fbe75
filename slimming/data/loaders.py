"""The two loaders ``slimming.data.build_loaders`` returns, which know nothing of datasets, files
or caches: ``TensorLoader`` (``loader="fast"``: images held as one uint8 tensor on the training
device, a whole batch augmented at once by ``crop_flip`` and ``normalize``, no worker processes,
no per-image Python) and ``EpochDataLoader`` (``loader="torchvision"``: a DataLoader with
``set_epoch``, ``num_samples`` and ``dataset_size`` like TensorLoader), with the rank and seed
checks they share with ``build_loaders``.

Layering: ``recipes`` <- this module <- ``data``; it imports only ``recipes`` (``PADDING``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import torch
from torch.utils.data import DataLoader, DistributedSampler, Subset

from .recipes import PADDING

# --------------------------------------------------------------------------- batch-wise augmentation

def crop_flip(images: torch.Tensor, top: torch.Tensor, left: torch.Tensor, flip: torch.Tensor,
              padding: int = PADDING) -> torch.Tensor:
    """Crop every image of a batch from its zero-padded copy at its own offset, mirrored where
    asked. ``images`` (B, C, H, W) any dtype; ``top``, ``left`` int64 (B,) in [0, 2 * padding];
    ``flip`` bool (B,). Returns (B, C, H, W): ``out[i] = pad(images[i])[:, top:top+H, left:left+W]``,
    flipped left-right where ``flip[i]``. A few tensor ops, no Python loop over the batch."""
    b, c, h, w = images.shape
    padded = torch.nn.functional.pad(images, (padding,) * 4)  # zeros: padded before normalising
    windows = padded.unfold(2, h, 1).unfold(3, w, 1)  # a view (B, C, 2p+1, 2p+1, H, W), no copy
    out = windows.permute(0, 2, 3, 1, 4, 5)[torch.arange(b, device=images.device), top, left]
    return torch.where(flip[:, None, None, None], out.flip(3), out)


def normalize(images: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """uint8 (B, C, H, W) -> float32 ``(x / 255 - mean) / std``, mean and std (1, C, 1, 1); the
    same operations in the same order as torchvision's ToDtype(scale=True) + Normalize."""
    return images.float().mul_(1.0 / 255).sub_(mean).div_(std)


class TensorLoader:
    """Batches from images held in memory on ``device``: ``images`` uint8 (N, 3, H, W),
    ``labels`` int64 (N,). Yields ``(x, y)``: x float32 (B, 3, H, W) normalised with ``mean`` and
    ``std``, y int64 (B,), both on ``device``; the last batch may be smaller.

    ``train=True``: a seeded shuffle and, per sample, a random crop of the image zero-padded by
    ``padding`` pixels (4: CIFAR's RandomCrop(32, padding=4)) and a random horizontal flip.
    The epoch's order and augmentation are a pure function of ``(seed, epoch)``: ``set_epoch(e)``
    selects epoch ``e`` (like DistributedSampler), so a resumed run sees the same batches;
    without it each pass moves on to the next epoch by itself.
    With ``world_size`` W every rank draws the same permutation, pads it to a multiple of W by
    repeating its start and takes ``perm[rank::W]``: every rank gets the same number of batches.

    ``train=False``: no shuffle, no augmentation; rank r gets samples r, r + W, r + 2W, ...
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, batch_size: int, *, train: bool,
                 mean: Sequence[float], std: Sequence[float], seed: int | None = None,
                 device: str | torch.device = "cpu", rank: int = 0, world_size: int = 1,
                 padding: int = PADDING) -> None:
        if (images.dtype != torch.uint8 or images.dim() != 4 or len(images) != len(labels)
                or len(labels) == 0):
            raise ValueError(f"expected uint8 images (N, C, H, W) and N labels, N > 0, got {images.dtype} "
                             f"{tuple(images.shape)} and {tuple(labels.shape)}")
        check_rank(rank, world_size)
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if padding < 0:
            raise ValueError(f"padding must be >= 0, got {padding}")
        self.padding = padding
        self.device = torch.device(device)
        self.images = images.contiguous().to(self.device)  # moved once; batches are gathered there
        self.labels = labels.to(self.device, torch.int64)
        self.mean = torch.tensor(mean, dtype=torch.float32, device=self.device).view(1, -1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32, device=self.device).view(1, -1, 1, 1)
        self.batch_size, self.train, self.rank, self.world_size = batch_size, train, rank, world_size
        self.seed = pick_seed(seed, world_size)
        self.epoch = 0
        self.dataset_size = len(labels)
        self.num_samples = (math.ceil(self.dataset_size / world_size) if train
                            else len(range(rank, self.dataset_size, world_size)))

    def __len__(self) -> int:
        """Batches this rank yields per epoch."""
        return math.ceil(self.num_samples / self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def plan(self, epoch: int) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None,
                                        torch.Tensor | None]:
        """This rank's sample indices (num_samples,) for ``epoch`` and, when training, the crop
        offsets ``top``, ``left`` (num_samples,) and ``flip`` flags, all on the CPU."""
        n, world = self.dataset_size, self.world_size
        if not self.train:
            return torch.arange(self.rank, n, world), None, None, None
        g = torch.Generator().manual_seed(self.seed + epoch)  # as DistributedSampler does
        total = self.num_samples * world
        perm = torch.randperm(n, generator=g)
        perm = perm.repeat(math.ceil(total / n))[:total]  # pad by repeating the start
        # drawn for every position of the padded order on every rank: a sample's augmentation
        # depends on (seed, epoch, position) only, not on the rank that gets it
        top = torch.randint(2 * self.padding + 1, (total,), generator=g)
        left = torch.randint(2 * self.padding + 1, (total,), generator=g)
        flip = torch.rand(total, generator=g) < 0.5
        take = slice(self.rank, total, world)
        return perm[take], top[take], left[take], flip[take]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        epoch, self.epoch = self.epoch, self.epoch + 1  # taken now, not at the first next()
        return self._batches(*(t.to(self.device) if t is not None else None for t in self.plan(epoch)))

    def _batches(self, index, top, left, flip) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for start in range(0, self.num_samples, self.batch_size):
            batch = slice(start, start + self.batch_size)
            idx = index[batch]
            x = self.images[idx]
            if self.train:
                x = crop_flip(x, top[batch], left[batch], flip[batch], self.padding)
            yield normalize(x, self.mean, self.std), self.labels[idx]


class EpochDataLoader(DataLoader):
    """A DataLoader with ``set_epoch`` (forwarded to a DistributedSampler, otherwise reseeding
    the shuffle generator with ``seed + epoch``, so that a resumed run sees the same order),
    ``num_samples`` (samples this rank sees per epoch) and ``dataset_size``, like TensorLoader."""

    def set_epoch(self, epoch: int) -> None:
        if isinstance(self.sampler, DistributedSampler):
            self.sampler.set_epoch(epoch)
        elif self.generator is not None and getattr(self, "seed", None) is not None:
            self.generator.manual_seed(self.seed + epoch)

    @property
    def num_samples(self) -> int:
        return len(self.sampler)

    @property
    def dataset_size(self) -> int:
        ds = self.dataset
        return len(ds.dataset) if isinstance(ds, Subset) else len(ds)


def check_rank(rank: int, world_size: int) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank {rank}, world_size {world_size}")


def pick_seed(seed: int | None, world_size: int) -> int:
    """``seed``, else 0 under DDP (every rank must agree, as DistributedSampler's default), else
    a fresh random one (leaving the global RNG untouched)."""
    if seed is not None:
        return int(seed)
    return 0 if world_size > 1 else torch.Generator().seed() % 2**62
