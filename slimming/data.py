"""Datasets: CIFAR-10/100 (torchvision), an ImageFolder of images of any size, a synthetic task.

Every batch is (B, 3, N, N) for an image size N (``image_size``; by default 32 when every image
is 32x32, else 224), normalised per channel with the training images' mean and std
(``norm="dataset"``) or ImageNet's (``norm="imagenet"``). Two recipes:

- images that are all NxN already (CIFAR, a folder resized beforehand): training takes a random
  NxN crop of the image zero-padded by N // 8 pixels (4 at 32) and flips it horizontally;
  evaluation uses the images as they are. Nothing is resized.
- anything else: training takes ``RandomResizedCrop(N)`` and a flip, evaluation resizes the
  shorter side to ``round(N * 8 / 7)`` and crops the centre NxN (the standard ImageNet recipe),
  with torchvision's transforms v2 on uint8 tensors.

Two loaders serve the same batches. ``TensorLoader`` (``loader="fast"``) keeps the whole dataset
as one uint8 tensor on the training device and augments a whole batch with a few tensor ops: no
worker processes, no per-image Python. It serves the first recipe only, and only a dataset whose
decoded pixels fit under ``fast_loader_limit()``; anything else goes to the DataLoader path with
one line on stderr saying why. ``loader="torchvision"`` is the usual Dataset + DataLoader.
An image folder is listed and read by ``slimming.images`` (each file's size checked from its
header before it is decoded, symlink loops not followed). What its headers say and its measured
mean and std are cached in a small checksummed file; for the fast loader its pixels are decoded
once and cached as a checksummed ``.pt`` file. Both are verified before every use and keyed by
the folder's listing, so a changed folder is read again.

What was chosen (image size, recipe, mean and std, loader) is ``DataInfo``, the ``info``
attribute of every loader and dataset built here: store ``info.as_dict()`` in a checkpoint.
Imports torchvision only when called.
"""

from __future__ import annotations

import hashlib
import math
import operator
import os
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset

from .errors import CheckpointError, DataError, first_line
from .images import MAX_PIXELS, check_image, list_images, read_image, shown
from .safeload import read_file, verify_checksum

DATASETS = ("cifar10", "cifar100", "imagefolder", "synthetic")
LOADERS = ("fast", "torchvision")
NORMS = ("dataset", "imagenet")
# Per-channel mean and std of the CIFAR training images (as in the paper's code); the synthetic
# dataset uses CIFAR-10's: BN makes the exact values matter little. An image folder's are measured.
STATS = {"cifar10": ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),
         "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762))}
IMAGENET_STATS = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
PADDING = 4  # RandomCrop(32, padding=4): padding_for(32)
SMALL_SIZE, LARGE_SIZE = 32, 224  # the default image size: 32 when every image is 32x32, else 224
STATS_IMAGES = 3000  # an image folder's mean and std are measured on at most this many images
STATS_SEED = 0  # ... drawn with this seed
FAST_LIMIT = 4 * 2**30  # the fast loader holds at most this many decoded bytes (and 1/4 of RAM)
# version 2: images read by slimming.images (PIL; 16-bit scaled as v >> 8, no longer wrapped)
CACHE_FORMAT, CACHE_VERSION = "slimming-decoded", 2
INFO_FORMAT, INFO_VERSION = "slimming-imagefolder-info", 1
# images in each of the built-in datasets, train + test (all 32x32)
BUILTIN_IMAGES = {"cifar10": 60000, "cifar100": 60000, "synthetic": 2560 + 512}


def default_root() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "slimming" / "data"


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
        _check_rank(rank, world_size)
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
        self.seed = _pick_seed(seed, world_size)
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


def _check_rank(rank: int, world_size: int) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank {rank}, world_size {world_size}")


def _count(flag: str, value, least: int) -> int:
    """``value`` as an int >= ``least``, else a DataError naming ``flag``."""
    try:
        n = operator.index(value)  # int or NumPy integer; no float, no bool
    except TypeError:
        n = None
    if n is None or isinstance(value, bool) or n < least:
        raise DataError(f"{flag} must be an integer >= {least}, got {value!r}")
    return n


def _pick_seed(seed: int | None, world_size: int) -> int:
    """``seed``, else 0 under DDP (every rank must agree, as DistributedSampler's default), else
    a fresh random one (leaving the global RNG untouched)."""
    if seed is not None:
        return int(seed)
    return 0 if world_size > 1 else torch.Generator().seed() % 2**62


# --------------------------------------------------------------------------- sources

def _resolve_root(name: str, root) -> Path:
    if name not in DATASETS:
        raise DataError(f"unknown dataset {name!r}; choose one of: {', '.join(DATASETS)}")
    if root is None:
        if name == "imagefolder":
            raise DataError("--dataset imagefolder needs --data-root DIR holding train/ and test/ "
                            "(or val/)")
        return default_root()
    return Path(root)


def _image_size(value) -> int | None:
    """``value`` (None, or an int >= 1 whose square is at most MAX_PIXELS), else a DataError."""
    if value is None:
        return None
    n = _count("--image-size", value, 1)
    if n * n > MAX_PIXELS:
        raise DataError(f"--image-size {n} makes images of more than {MAX_PIXELS:,} pixels; "
                        f"choose at most {math.isqrt(MAX_PIXELS)}")
    return n


def _norm(norm) -> tuple[str, tuple[float, ...] | None, tuple[float, ...] | None]:
    """``(kind, mean, std)`` for ``norm``: "dataset" (mean and std still to be found), "imagenet",
    or a pair ``(mean, std)`` of three floats each ("given", std > 0)."""
    if isinstance(norm, str):
        if norm not in NORMS:
            raise DataError(f"unknown norm {norm!r}; choose one of: {', '.join(NORMS)}")
        return (norm, *IMAGENET_STATS) if norm == "imagenet" else (norm, None, None)
    try:
        mean, std = (tuple(float(v) for v in values) for values in norm)
    except (TypeError, ValueError):
        mean = std = ()
    if not (len(mean) == len(std) == 3 and all(map(math.isfinite, mean + std)) and min(std) > 0):
        raise DataError(f"norm must be 'dataset', 'imagenet' or (mean, std), three floats each "
                        f"with std > 0; got {str(norm)[:80]}")
    return "given", mean, std


class ImageFiles(Dataset):
    """The images of an image folder read one at a time (``loader="torchvision"``): item ``i`` is
    ``(transform(image), label)``, image uint8 RGB (3, H, W) as ``read_image`` decodes it, the
    same pixels the fast loader's cache holds. ``classes``, ``samples`` (path, label) and
    ``targets`` as in torchvision's ImageFolder."""

    def __init__(self, classes: list[str], samples: list[tuple[str, int]], transform=None):
        self.classes, self.samples, self.transform = classes, samples, transform
        self.targets = [label for _, label in samples]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        path, label = self.samples[i]
        x = read_image(path)  # an ImageError stays one line even from a worker process
        return (self.transform(x) if self.transform else x), label


def _list_imagefolder(root: Path) -> tuple[list[str], list[tuple[str, int]], list[tuple[str, int]], str]:
    """``(classes, train samples, test samples, test split name)`` of ``root/train/<class>/...``
    and ``root/test/<class>/...`` (or ``root/val/...`` when there is no test/), listed as
    ImageFolder does (``slimming.images.list_images``); samples are (path, label)."""
    if not root.is_dir():
        raise DataError(f"{shown(root)}: no such folder; --data-root must be a folder holding "
                        "train/<class>/<image> and test/<class>/<image> (or val/<class>/<image>)")
    if not (root / "train").is_dir():
        raise DataError(f"{shown(root)}: expected the layout train/<class>/<image> (no train/ folder)")
    split = next((s for s in ("test", "val") if (root / s).is_dir()), None)
    if split is None:
        raise DataError(f"{shown(root)}: expected the layout test/<class>/<image> or "
                        "val/<class>/<image> for the test split (no test/ or val/ folder)")
    classes, train = list_images(root / "train")
    test_classes, test = list_images(root / split)
    if classes != test_classes:
        raise DataError(f"{shown(root)}: train/ and {split}/ hold different class folders")
    return classes, train, test, split


@dataclass
class _Listing:
    """An image folder's splits as listed now, and the key of that listing (``_listing_key``)."""

    root: Path
    classes: list[str]
    train: list[tuple[str, int]]
    test: list[tuple[str, int]]
    test_split: str
    key: str


def _listing(root: Path) -> _Listing:
    classes, train, test, split = _list_imagefolder(root)
    return _Listing(root, classes, train, test, split, _listing_key(root, train + test))


def _cifar(name: str, root: Path, download: bool, train_transform=None, test_transform=None):
    from torchvision import datasets

    cls = datasets.CIFAR10 if name == "cifar10" else datasets.CIFAR100
    try:  # torchvision checks each file's MD5 before unpickling it: a tampered file is refused
        train = cls(str(root), train=True, download=download, transform=train_transform)
        test = cls(str(root), train=False, download=download, transform=test_transform)
    except RuntimeError:
        raise DataError(f"{name} not found under {root}: pass --download to fetch it, point "
                        "--data-root at a folder that holds it, or use --dataset imagefolder "
                        "--data-root DIR (a local copy) or --dataset synthetic") from None
    except OSError as e:  # a download that cannot reach the network
        raise DataError(f"{name}: download failed ({first_line(e)}); point --data-root "
                        "at a local copy or use --dataset imagefolder or synthetic") from None
    return train, test


# --------------------------------------------------------------------------- caches

def _labels(samples: list[tuple[str, int]]) -> torch.Tensor:
    return torch.tensor([label for _, label in samples], dtype=torch.int64)


def _listing_key(root: Path, samples: list[tuple[str, int]]) -> str:
    """Hash of the folder's absolute path and its sorted files with labels, sizes and mtimes.
    Paths go in as bytes (``os.fsencode``): a file name need not be valid UTF-8."""
    h = hashlib.sha256(f"{CACHE_VERSION}\n".encode() + os.fsencode(root.resolve()) + b"\n")
    for path, label in sorted(samples):
        try:
            st = os.stat(path)
        except OSError as e:  # a broken link, or a file removed since the listing
            raise DataError(f"{shown(path)}: cannot read it ({e.strerror}); fix or remove it") from None
        h.update(os.fsencode(os.path.relpath(path, root))
                 + f"\0{label}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def _cache_file(root: Path, cache_dir, suffix: str) -> Path:
    """``cache_dir`` (default ``~/.cache/slimming/decoded``) / ``imagefolder-<hash of root>``
    + ``suffix``: ".pt" for the decoded images, ".info" for the headers and statistics."""
    folder = Path(cache_dir) if cache_dir is not None else default_root().parent / "decoded"
    return folder / f"imagefolder-{hashlib.sha256(os.fsencode(root.resolve())).hexdigest()[:16]}{suffix}"


def _is(value, kind: type, expected) -> bool:
    """``value == expected`` for a value of type ``kind`` only: a hostile cache may hold a tensor
    where a string belongs, and ``tensor == str`` is no bool."""
    return isinstance(value, kind) and not isinstance(value, bool) and value == expected


def _open_cache(path: Path, fmt: str, version: int, key: str, what: str) -> dict | None:
    """The dict in the cache file ``path`` after its checksum is verified; None if it is
    another listing's or version's (the folder changed: stale, not broken). Anything wrong
    raises CheckpointError (one line)."""
    if path.is_symlink():  # we write regular files; a link may lead to /dev/zero or a FIFO
        raise CheckpointError(f"{shown(path)}: a symbolic link, not a file this toolkit wrote")
    blob = read_file(path)  # bounded weights_only load; every failure is a CheckpointError
    if not isinstance(blob, dict) or not _is(blob.get("format"), str, fmt):
        raise CheckpointError(f"{shown(path)}: not a slimming {what} cache")
    if not _is(blob.get("version"), int, version) or not _is(blob.get("key"), str, key):
        return None
    if not isinstance(blob.get("checksum"), str):
        raise CheckpointError(f"{shown(path)}: no checksum")
    verify_checksum(blob, path)
    return blob


def _read_cache(path: Path, verify, what: str):
    """``verify()``: the valid cache at ``path``, else None (to be rebuilt); an invalid one is
    said so in one line on stderr."""
    if not os.path.lexists(path):
        return None
    try:
        return verify()
    except (CheckpointError, OSError) as e:
        reason = e if isinstance(e, CheckpointError) else f"{shown(path)}: {e.strerror}"
        print(f"slimming: the {what} cache is invalid and is being rebuilt: {reason}", file=sys.stderr)
        return None


def _write_cache(blob: dict, path: Path, what: str, consequence: str) -> None:
    from .checkpoint import save_checkpoint

    try:
        save_checkpoint(blob, path)
    except OSError as e:  # a read-only or full disk, a folder in the way: do it again next time
        print(f"slimming: cannot write the {what} cache {shown(path)} "
              f"({e.strerror or first_line(e)}); {consequence}", file=sys.stderr)


# --------------------------------------------------------------------------- what the headers say

@dataclass
class _Folder:
    """An image folder's listing, the sizes its headers claim ((width, height) -> number of
    images, train and test) and the statistics measured so far (image size -> {"images",
    "mean", "std"}), kept in the information cache ``path``."""

    listing: _Listing
    sizes: Counter
    stats: dict
    path: Path


def _info_blob(folder: _Folder) -> dict:
    rows = sorted((w, h, n) for (w, h), n in folder.sizes.items())
    return {"format": INFO_FORMAT, "version": INFO_VERSION, "key": folder.listing.key,
            "sizes": torch.tensor(rows, dtype=torch.int64).reshape(-1, 3),
            "stats": [{"image_size": size, "images": e["images"], "mean": list(e["mean"]),
                       "std": list(e["std"])} for size, e in sorted(folder.stats.items())]}


def _floats(value, low: float, high: float, low_open: bool = False) -> bool:
    return (isinstance(value, list) and len(value) == 3
            and all(isinstance(v, float) and math.isfinite(v) and low <= v <= high
                    and not (low_open and v == low) for v in value))


def _verified_info(path: Path, listing: _Listing) -> tuple[Counter, dict] | None:
    """``(sizes, stats)`` from the information cache at ``path`` if it is this listing's, else
    None; an invalid one raises CheckpointError."""
    def bad(what: str) -> CheckpointError:
        return CheckpointError(f"{shown(path)}: {what}")

    blob = _open_cache(path, INFO_FORMAT, INFO_VERSION, listing.key, "image-information")
    if blob is None:
        return None
    count = len(listing.train) + len(listing.test)
    rows = blob.get("sizes")
    if not (isinstance(rows, torch.Tensor) and rows.dtype == torch.int64 and rows.dim() == 2
            and rows.shape[1] == 3 and len(rows) > 0):
        raise bad("its sizes are not int64 (K, 3)")
    # each bound checked alone first: a forged product or sum must not overflow int64
    if not (bool(((rows[:, :2] >= 1) & (rows[:, :2] <= MAX_PIXELS)).all())
            and bool(((rows[:, 2] >= 1) & (rows[:, 2] <= count)).all())
            and bool((rows[:, 0] * rows[:, 1] <= MAX_PIXELS).all()) and int(rows[:, 2].sum()) == count):
        raise bad("its sizes are not those of the folder's images")
    sizes: Counter = Counter()
    for w, h, n in rows.tolist():
        sizes[w, h] += n
    entries = blob.get("stats")
    if not isinstance(entries, list):
        raise bad("its stats are not a list")
    stats = {}
    for e in entries:
        if not (isinstance(e, dict) and set(e) == {"image_size", "images", "mean", "std"}
                and isinstance(e["image_size"], int) and not isinstance(e["image_size"], bool)
                and 1 <= e["image_size"] <= math.isqrt(MAX_PIXELS)
                and isinstance(e["images"], int) and not isinstance(e["images"], bool)
                and 1 <= e["images"] <= len(listing.train)
                and _floats(e["mean"], 0.0, 1.0) and _floats(e["std"], 0.0, 1.0, low_open=True)):
            raise bad("its stats are not image sizes with a mean and std in [0, 1]")
        stats[e["image_size"]] = {"images": e["images"], "mean": tuple(e["mean"]), "std": tuple(e["std"])}
    return sizes, stats


def _scan(listing: _Listing, cache_dir) -> _Folder:
    """The sizes of every image of ``listing`` from their headers (each file checked: a bad one
    stops the run now, not in the middle of an epoch), read once and cached with the listing's
    key: an unchanged folder is not read again."""
    path = _cache_file(listing.root, cache_dir, ".info")
    found = _read_cache(path, lambda: _verified_info(path, listing), "image-information")
    if found is not None:
        return _Folder(listing, *found, path)
    sizes = Counter(check_image(p) for p, _ in listing.train + listing.test)
    folder = _Folder(listing, sizes, {}, path)
    _write_cache(_info_blob(folder), path, "image-information", "the next run reads the headers again")
    return folder


def _stats_sample(n: int) -> torch.Tensor:
    """Indices of the training images whose mean and std are measured: all of them, or
    ``STATS_IMAGES`` drawn with ``STATS_SEED`` (sorted, so files are read in folder order)."""
    if n <= STATS_IMAGES:
        return torch.arange(n)
    return torch.randperm(n, generator=torch.Generator().manual_seed(STATS_SEED))[:STATS_IMAGES].sort().values


def _measure(batches: Iterable[torch.Tensor]) -> tuple[tuple[float, ...], tuple[float, ...], int]:
    """``(mean, std, images)``: the per-channel mean and standard deviation, over every pixel,
    of ``x / 255`` for uint8 batches x (B, 3, H, W). Computed from exact per-channel histograms,
    so any batching of the same images gives the same figures. A std under 1/255 (a constant
    channel) is raised to 1/255, so normalising never divides by zero."""
    hist = torch.zeros(3, 256, dtype=torch.int64)
    images = 0
    for x in batches:
        images += len(x)
        for c in range(3):
            hist[c] += torch.bincount(x[:, c].reshape(-1), minlength=256)
    values = torch.arange(256, dtype=torch.float64) / 255
    pixels = hist.sum(1).double()
    mean = hist.double() @ values / pixels
    var = hist.double() @ values.square() / pixels - mean.square()
    std = var.clamp_min(0).sqrt().clamp_min(1 / 255)
    return tuple(mean.tolist()), tuple(std.tolist()), images


def _folder_stats(folder: _Folder, image_size: int, resize: int | None, *, workers: int = 0,
                  images: torch.Tensor | None = None, say: bool = True) -> tuple[tuple, tuple]:
    """The mean and std of the folder's training images as the network sees them at
    ``image_size`` (resized as evaluation resizes them), measured once on a fixed sample of at
    most ``STATS_IMAGES`` and cached. ``images``: the training images already decoded, NxN."""
    train = folder.listing.train
    index = _stats_sample(len(train))
    entry = folder.stats.get(image_size)
    if entry is not None and entry["images"] == len(index):
        return entry["mean"], entry["std"]
    start = time.perf_counter()
    if images is not None:
        batches = (images[index[i:i + 256]] for i in range(0, len(index), 256))
    else:
        transform = None if resize is None else make_transform(image_size, resize, (), (), False,
                                                               normalize=False)
        files = ImageFiles(folder.listing.classes, [train[i] for i in index.tolist()], transform)
        loader = DataLoader(files, batch_size=64, num_workers=workers if len(files) >= 512 else 0)
        batches = (x for x, _ in loader)
    mean, std, n = _measure(batches)
    folder.stats[image_size] = {"images": n, "mean": mean, "std": std}
    _write_cache(_info_blob(folder), folder.path, "image-information", "the next run measures again")
    if say:
        print(f"slimming: measured the mean ({', '.join(f'{v:.4f}' for v in mean)}) and std "
              f"({', '.join(f'{v:.4f}' for v in std)}) of {n:,} training images of "
              f"{shown(folder.listing.root)} at {image_size}x{image_size} in "
              f"{time.perf_counter() - start:.1f} s, cached in {shown(folder.path)}", file=sys.stderr)
    return mean, std


# --------------------------------------------------------------------------- choosing

def _memory() -> int:
    """Bytes of memory this process may use: the machine's RAM (``os.sysconf``, else
    /proc/meminfo), less if a cgroup (v2) limits it."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = 0
    if total <= 0:
        try:
            with open("/proc/meminfo") as f:
                total = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:"))
        except (OSError, ValueError, IndexError, StopIteration):
            total = 4 * FAST_LIMIT
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        if limit.isdigit():
            total = min(total, int(limit))
    except OSError:
        pass
    return total


def fast_loader_limit() -> int:
    """The most bytes of decoded images (train + test) the fast loader holds: a quarter of the
    machine's memory, shared by the processes torchrun starts on it (``LOCAL_WORLD_SIZE``, each
    holds its own copy), and at most ``FAST_LIMIT`` (4 GiB)."""
    try:
        local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        local = 1
    return min(FAST_LIMIT, _memory() // (4 * local))


def _human(nbytes: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} bytes"


def _choose_size(sizes: Counter, image_size: int | None) -> tuple[int, int | None]:
    """``(N, resize)``: ``image_size``, by default 32 when every image is 32x32, else 224; and
    None when every image is NxN (used as it is), else the shorter side to resize to."""
    if image_size is None:
        image_size = SMALL_SIZE if set(sizes) == {(SMALL_SIZE, SMALL_SIZE)} else LARGE_SIZE
    return image_size, None if set(sizes) == {(image_size, image_size)} else resize_for(image_size)


def _not_fast(sizes: Counter, image_size: int, resize: int | None) -> str | None:
    """Why the fast loader cannot serve images of ``sizes`` at ``image_size``, or None."""
    n = image_size
    if resize is not None:
        if len(sizes) == 1:
            ((w, h),) = sizes
            what = f"the images are {w}x{h}"
        else:
            small, large = (f(sizes, key=lambda s: (s[0] * s[1], s)) for f in (min, max))
            what = (f"the images are of {len(sizes):,} sizes (from {small[0]}x{small[1]} to "
                    f"{large[0]}x{large[1]})")
        return f"{what}, resized to {n}x{n} as they are read, which only the DataLoader path does"
    count = sum(sizes.values())
    nbytes, limit = count * 3 * n * n, fast_loader_limit()
    if nbytes > limit:
        return (f"{count:,} images of {n}x{n} would take {_human(nbytes)} decoded, over the fast "
                f"loader's limit of {_human(limit)} here")
    return None


def _plan(name: str, root, cache_dir, image_size, norm) -> tuple:
    """``(root, folder or None, sizes, N, resize, (norm kind, mean, std))`` for the arguments of
    ``build_loaders``/``build_datasets``; an image folder's headers are all read (or their
    cached sizes) here."""
    root = _resolve_root(name, root)
    image_size, norm = _image_size(image_size), _norm(norm)
    if name == "imagefolder":
        folder = _scan(_listing(root), cache_dir)
        sizes = folder.sizes
    else:
        folder, sizes = None, Counter({(SMALL_SIZE, SMALL_SIZE): BUILTIN_IMAGES[name]})
    kind, mean, std = norm
    if kind == "dataset" and folder is None:
        mean, std = STATS.get(name, STATS["cifar10"])
    return (root, folder, sizes, *_choose_size(sizes, image_size), (kind, mean, std))


# --------------------------------------------------------------------------- datasets

def _datasets(name: str, root: Path, download: bool, folder: _Folder | None, image_size: int,
              resize: int | None, norm: tuple, workers: int, say: bool):
    """(train set, test set, number of classes, DataInfo) for the DataLoader path."""
    kind, mean, std = norm
    if folder is not None and mean is None:
        mean, std = _folder_stats(folder, image_size, resize, workers=workers, say=say)
    info = DataInfo(image_size, resize, tuple(mean), tuple(std), kind, "torchvision",
                    folder.listing.test_split if folder is not None else "test")

    def pipeline(train: bool, from_pil: bool = False):
        return make_transform(image_size, resize, mean, std, train, from_pil)

    if name == "synthetic":
        train = TensorImages(*synthetic_images(2560, split_seed=1), pipeline(True))
        test = TensorImages(*synthetic_images(512, split_seed=2), pipeline(False))
        num_classes = 10
    elif folder is not None:
        listing = folder.listing
        train = ImageFiles(listing.classes, listing.train, pipeline(True))
        test = ImageFiles(listing.classes, listing.test, pipeline(False))
        num_classes = len(listing.classes)
    else:
        train, test = _cifar(name, root, download, pipeline(True, True), pipeline(False, True))
        num_classes = len(train.classes)
    train.info = test.info = info
    return train, test, num_classes, info


def build_datasets(name: str, root: str | os.PathLike | None = None, download: bool = False, *,
                   image_size: int | None = None, norm="dataset",
                   cache_dir: str | os.PathLike | None = None, workers: int = 0):
    """(train set, test set, number of classes) for dataset ``name`` under ``root``, items
    ``(float32 (3, N, N), label)``; both sets' ``info`` is the ``DataInfo`` they were made with.
    ``image_size`` N (None: 32 when every image is 32x32, else 224) and ``norm`` ("dataset",
    "imagenet" or a pair (mean, std)) as for ``build_loaders``. An image folder's files are all
    checked from their headers here (tens of microseconds each; remembered in ``cache_dir`` for
    an unchanged folder, as its measured mean and std are), so a bad one stops the run now, not
    in the middle of an epoch. ``workers`` processes read the images whose mean and std are
    measured."""
    workers = _count("--workers", workers, 0)
    root, folder, _, n, resize, norm = _plan(name, root, cache_dir, image_size, norm)
    return _datasets(name, root, download, folder, n, resize, norm, workers, True)[:3]


# --------------------------------------------------------------------------- the decode cache

_decode = read_image  # one file -> uint8 (3, H, W); a module global so tests can count calls


def _decode_all(samples: list[tuple[str, int]], size: tuple[int, int] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Images uint8 (N, 3, H, W) and labels int64 (N,) of ``samples`` (path, label), every image
    of one size (H, W): ``size``, else the first image's."""
    first = None
    for i, (path, _) in enumerate(samples):
        x = _decode(path)
        if first is None:
            first = path
            size = size or tuple(x.shape[1:])
            images = torch.empty(len(samples), 3, *size, dtype=torch.uint8)
        if tuple(x.shape[1:]) != size:
            raise DataError(f"{shown(path)}: {x.shape[2]}x{x.shape[1]} pixels, but the images "
                            f"decoded with it are {size[1]}x{size[0]} ({shown(first)}); the fast "
                            "loader holds images of one size: use the DataLoader path "
                            "(--loader torchvision)")
        images[i] = x
    return images, _labels(samples)


def _verified_cache(path: Path, key: str, classes: list[str], labels: dict[str, torch.Tensor],
                    size: tuple[int, int] | None = None) -> dict | None:
    """The cache at ``path`` if it holds this listing's images (all of ``size`` (H, W) when
    given, else of the training images' one size); None if it is another listing's (the folder
    changed: stale, not broken). Anything else raises CheckpointError (one line)."""
    def bad(what: str) -> CheckpointError:
        return CheckpointError(f"{shown(path)}: {what}")

    blob = _open_cache(path, CACHE_FORMAT, CACHE_VERSION, key, "decoded-image")
    if blob is None:
        return None
    found = blob.get("classes")
    if not (isinstance(found, list) and all(isinstance(c, str) for c in found) and found == classes):
        raise bad("its classes are not the folder's class folders")
    for split in ("train", "test"):
        x, y, want = blob.get(f"{split}_images"), blob.get(f"{split}_labels"), labels[split]
        n = len(want)
        if size is None and isinstance(x, torch.Tensor) and x.dim() == 4 and min(x.shape[2:]) > 0:
            size = tuple(x.shape[2:])
        h, w = size or ("H", "W")
        if not (isinstance(x, torch.Tensor) and x.dtype == torch.uint8 and x.shape == (n, 3, *(size or ()))):
            raise bad(f"its {split}_images are not uint8 ({n}, 3, {h}, {w})")
        if not (isinstance(y, torch.Tensor) and y.dtype == torch.int64 and y.shape == (n,)):
            raise bad(f"its {split}_labels are not int64 ({n},)")
        if n and (int(y.min()) < 0 or int(y.max()) >= len(classes)):
            raise bad(f"its {split}_labels fall outside [0, {len(classes)})")
        if not torch.equal(y, want):
            raise bad(f"its {split}_labels are not the folder's")
    return blob


def _decoded(listing: _Listing, cache_dir, size: tuple[int, int] | None = None) -> dict:
    """``decode_imagefolder`` for a listing made already; ``size`` (H, W) the images must have."""
    path = _cache_file(listing.root, cache_dir, ".pt")
    labels = {"train": _labels(listing.train), "test": _labels(listing.test)}
    blob = _read_cache(path, lambda: _verified_cache(path, listing.key, listing.classes, labels, size),
                       "decoded-image")
    if blob is not None:
        return blob
    start = time.perf_counter()
    train_images, train_labels = _decode_all(listing.train, size)
    test_images, test_labels = _decode_all(listing.test, tuple(train_images.shape[2:]))
    # said after the fact: a bad image found half-way is then the only line the user sees
    print(f"slimming: decoded {len(listing.train) + len(listing.test):,} images of "
          f"{shown(listing.root)} in {time.perf_counter() - start:.1f} s, cached in {shown(path)}",
          file=sys.stderr)
    blob = {"format": CACHE_FORMAT, "version": CACHE_VERSION, "key": listing.key,
            "classes": listing.classes, "train_images": train_images, "train_labels": train_labels,
            "test_images": test_images, "test_labels": test_labels}
    _write_cache(blob, path, "decoded-image", "the next run decodes again")
    return blob


def decode_imagefolder(root: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> dict:
    """Decode ``root/train/<class>/*`` and ``root/test/<class>/*`` (or ``root/val/...``), whose
    images must all be of one size H x W, once, cached in ``cache_dir`` (default
    ``~/.cache/slimming/decoded``) under a key of the folder's path and its files' names, sizes
    and mtimes: any change to the folder rebuilds the cache. A cache is used only after its
    checksum, shapes, classes and labels are verified; a cache file that cannot be written (a
    folder in the way, a read-only disk) only costs decoding again next time.

    Returns ``{"classes": [...] (ImageFolder's order), "train_images": uint8 (N, 3, H, W),
    "train_labels": int64 (N,), "test_images": ..., "test_labels": ...}``.
    """
    return _decoded(_listing(Path(root)), cache_dir)


def load_images(name: str, root: str | os.PathLike | None = None, download: bool = False,
                cache_dir: str | os.PathLike | None = None):
    """The whole dataset as tensors at its own size: ``(train_images uint8 (N, 3, H, W),
    train_labels int64 (N,), test_images (M, 3, H, W), test_labels (M,), num_classes)``; H = W
    = 32 but for an image folder, whose images must all be of one size."""
    root = _resolve_root(name, root)
    if name == "synthetic":
        return *synthetic_images(2560, split_seed=1), *synthetic_images(512, split_seed=2), 10
    if name == "imagefolder":
        b = decode_imagefolder(root, cache_dir)
        return b["train_images"], b["train_labels"], b["test_images"], b["test_labels"], len(b["classes"])
    train, test = _cifar(name, root, download)

    def nchw(ds) -> tuple[torch.Tensor, torch.Tensor]:  # .data is NumPy (N, 32, 32, 3) uint8
        return (torch.from_numpy(ds.data).permute(0, 3, 1, 2).contiguous(),
                torch.tensor(ds.targets, dtype=torch.int64))

    return *nchw(train), *nchw(test), len(train.classes)


# --------------------------------------------------------------------------- loaders

def build_loaders(name: str, root: str | os.PathLike | None = None, batch_size: int = 64,
                  workers: int = 0, download: bool = False, seed: int | None = None,
                  pin_memory: bool = False, loader: str = "fast", device: str | torch.device = "cpu",
                  rank: int = 0, world_size: int = 1, cache_dir: str | os.PathLike | None = None,
                  image_size: int | None = None, norm="dataset"):
    """(train loader, test loader, number of classes) for this ``rank`` of ``world_size``.
    Batches are float32 (B, 3, N, N), N = ``image_size``; both loaders' ``info`` is the
    ``DataInfo`` saying how they were made (N, recipe, mean and std, loader).

    ``image_size``: None picks 32 when every image (train and test, from their headers) is
    32x32, else 224. Images that are all NxN are padded, cropped and flipped as CIFAR's; any
    others are resized (RandomResizedCrop for training, resize + centre crop for evaluation).
    ``norm``: "dataset" (CIFAR's and the synthetic set's constants; an image folder's training
    images measured once, cached), "imagenet", or an explicit ``(mean, std)`` pair (say, the one
    a checkpoint recorded).

    ``loader="fast"``: two TensorLoaders holding the data on ``device`` (``workers`` and
    ``pin_memory`` unused), when the images are all NxN and decoded fit under
    ``fast_loader_limit()``; otherwise one line on stderr says why and the DataLoader path is
    used. ``loader="torchvision"``: Dataset + DataLoader with ``workers`` processes; under DDP a
    DistributedSampler for training and a strided, unpadded test shard.
    Both kinds have ``set_epoch(epoch)`` and ``num_samples``; both shuffle from ``seed``, so a
    seeded run sees the same batches. A ``batch_size`` above the number of samples gives one
    batch of them all; a ``batch_size`` < 1 or ``workers`` < 0 (or not an integer) is a DataError.
    """
    if loader not in LOADERS:
        raise DataError(f"unknown loader {loader!r}; choose one of: {', '.join(LOADERS)}")
    _check_rank(rank, world_size)
    batch_size, workers = _count("--batch-size", batch_size, 1), _count("--workers", workers, 0)
    seed = _pick_seed(seed, world_size)
    test_batch = max(256, batch_size)
    say = rank == 0
    root, folder, sizes, image_size, resize, norm = _plan(name, root, cache_dir, image_size, norm)
    if loader == "fast":
        why = _not_fast(sizes, image_size, resize)
        if why is None:
            return _fast_loaders(name, root, download, cache_dir, folder, image_size, norm,
                                 batch_size, test_batch, seed, device, rank, world_size, say)
        if say:
            print(f"slimming: {why}; using the DataLoader path with --workers {workers}", file=sys.stderr)
    # a batch larger than the set is the whole set: the same batches, and DataLoader's sampler
    # cannot even take a batch size above sys.maxsize
    train, test, num_classes, info = _datasets(name, root, download, folder, image_size, resize,
                                               norm, workers, say)
    batch_size, test_batch = min(batch_size, len(train)), min(test_batch, len(test))
    g = torch.Generator().manual_seed(seed)
    common = dict(num_workers=workers, pin_memory=pin_memory, persistent_workers=workers > 0)
    if world_size > 1:
        sampler = DistributedSampler(train, num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
        train_loader = EpochDataLoader(train, batch_size=batch_size, sampler=sampler, generator=g, **common)
        test = Subset(test, range(rank, len(test), world_size))
    else:
        train_loader = EpochDataLoader(train, batch_size=batch_size, shuffle=True, generator=g, **common)
        train_loader.seed = seed
    test_loader = EpochDataLoader(test, batch_size=test_batch, shuffle=False, **common)
    train_loader.info = test_loader.info = info
    return train_loader, test_loader, num_classes


def _fast_loaders(name, root, download, cache_dir, folder, image_size, norm, batch_size, test_batch,
                  seed, device, rank, world_size, say):
    """Two TensorLoaders (images all NxN already, pad-and-crop recipe)."""
    kind, mean, std = norm
    if folder is not None:
        blob = _decoded(folder.listing, cache_dir, (image_size, image_size))
        train_x, train_y, test_x, test_y = (blob[k] for k in ("train_images", "train_labels",
                                                               "test_images", "test_labels"))
        num_classes = len(folder.listing.classes)
        if mean is None:
            mean, std = _folder_stats(folder, image_size, None, images=train_x, say=say)
    else:
        train_x, train_y, test_x, test_y, num_classes = load_images(name, root, download)
    info = DataInfo(image_size, None, tuple(mean), tuple(std), kind, "fast",
                    folder.listing.test_split if folder is not None else "test")
    common = dict(mean=mean, std=std, seed=seed, device=device, rank=rank, world_size=world_size,
                  padding=info.padding)
    train = TensorLoader(train_x, train_y, min(batch_size, len(train_y)), train=True, **common)
    test = TensorLoader(test_x, test_y, min(test_batch, len(test_y)), train=False, **common)
    train.info = test.info = info
    return train, test, num_classes
