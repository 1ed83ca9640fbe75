"""Datasets: CIFAR-10/100 (torchvision), an ImageFolder of 32x32 images, and a synthetic task.

Training batches get a random 32x32 crop of the 4-pixel zero-padded image and a horizontal
flip; every batch is normalised per channel. Imports torchvision only when called.

Two loaders serve the same batches. ``TensorLoader`` (``loader="fast"``) keeps the whole dataset
as one uint8 tensor on the training device and augments a whole batch with a few tensor ops: no
worker processes, no per-image Python. ``loader="torchvision"`` is the usual Dataset + DataLoader.
An image folder is listed and read by ``slimming.images`` (each file's size checked from its
header before it is decoded, symlink loops not followed), for the fast loader decoded once and
cached as a checksummed ``.pt`` file, verified before every use.
"""

from __future__ import annotations

import hashlib
import math
import operator
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset

from .errors import CheckpointError, DataError, first_line
from .images import check_image, list_images, read_image, shown
from .safeload import read_file, verify_checksum

DATASETS = ("cifar10", "cifar100", "imagefolder", "synthetic")
LOADERS = ("fast", "torchvision")
# Per-channel mean and std of the CIFAR training images (as in the paper's code); the
# imagefolder and synthetic datasets use CIFAR-10's: BN makes the exact values matter little.
STATS = {"cifar10": ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),
         "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762))}
PADDING = 4  # RandomCrop(32, padding=4)
# version 2: images read by slimming.images (PIL; 16-bit scaled as v >> 8, no longer wrapped)
CACHE_FORMAT, CACHE_VERSION = "slimming-decoded", 2


def default_root() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "slimming" / "data"


def transforms(name: str, train: bool, from_pil: bool):
    from torchvision.transforms import v2

    mean, std = STATS.get(name, STATS["cifar10"])
    ops = [v2.ToImage()] if from_pil else []
    if train:
        ops += [v2.RandomCrop(32, padding=PADDING), v2.RandomHorizontalFlip()]
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

    ``train=True``: a seeded shuffle and, per sample, a random crop of the zero-padded image and a
    random horizontal flip. The epoch's order and augmentation are a pure function of
    ``(seed, epoch)``: ``set_epoch(e)`` selects epoch ``e`` (like DistributedSampler), so a resumed
    run sees the same batches; without it each pass moves on to the next epoch by itself.
    With ``world_size`` W every rank draws the same permutation, pads it to a multiple of W by
    repeating its start and takes ``perm[rank::W]``: every rank gets the same number of batches.

    ``train=False``: no shuffle, no augmentation; rank r gets samples r, r + W, r + 2W, ...
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, batch_size: int, *, train: bool,
                 mean: Sequence[float], std: Sequence[float], seed: int | None = None,
                 device: str | torch.device = "cpu", rank: int = 0, world_size: int = 1) -> None:
        if (images.dtype != torch.uint8 or images.dim() != 4 or len(images) != len(labels)
                or len(labels) == 0):
            raise ValueError(f"expected uint8 images (N, C, H, W) and N labels, N > 0, got {images.dtype} "
                             f"{tuple(images.shape)} and {tuple(labels.shape)}")
        _check_rank(rank, world_size)
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
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
        top = torch.randint(2 * PADDING + 1, (total,), generator=g)
        left = torch.randint(2 * PADDING + 1, (total,), generator=g)
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
                x = crop_flip(x, top[batch], left[batch], flip[batch])
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
            raise DataError("--dataset imagefolder needs --data-root DIR holding train/ and test/")
        return default_root()
    return Path(root)


class ImageFiles(Dataset):
    """The images of an image folder read one at a time (``loader="torchvision"``): item ``i`` is
    ``(transform(image), label)``, image uint8 RGB (3, 32, 32) as ``read_image`` decodes it, the
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


def _list_imagefolder(root: Path) -> tuple[list[str], list[tuple[str, int]], list[tuple[str, int]]]:
    """``(classes, train samples, test samples)`` of ``root/{train,test}/<class>/...``, listed as
    ImageFolder does (``slimming.images.list_images``); samples are (path, label)."""
    if not root.is_dir():
        raise DataError(f"{shown(root)}: no such folder; --data-root must be a folder holding "
                        "train/<class>/<image> and test/<class>/<image>")
    listed = []
    for split in ("train", "test"):
        if not (root / split).is_dir():
            raise DataError(f"{shown(root)}: expected the layout {split}/<class>/<image> "
                            f"(no {split}/ folder)")
        listed.append(list_images(root / split))
    (classes, train), (test_classes, test) = listed
    if classes != test_classes:
        raise DataError(f"{shown(root)}: train/ and test/ hold different class folders")
    return classes, train, test


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


def build_datasets(name: str, root: str | os.PathLike | None = None, download: bool = False):
    """(train set, test set, number of classes) for dataset ``name`` under ``root``. An image
    folder's files are all checked from their headers here (a few microseconds each), so a bad
    one stops the run now, not in the middle of an epoch."""
    root = _resolve_root(name, root)
    if name == "synthetic":
        train = TensorImages(*synthetic_images(2560, split_seed=1), transforms(name, True, False))
        test = TensorImages(*synthetic_images(512, split_seed=2), transforms(name, False, False))
        return train, test, 10
    if name == "imagefolder":
        classes, train_samples, test_samples = _list_imagefolder(root)
        for path, _ in train_samples + test_samples:
            check_image(path)
        return (ImageFiles(classes, train_samples, transforms(name, True, False)),
                ImageFiles(classes, test_samples, transforms(name, False, False)), len(classes))
    train, test = _cifar(name, root, download, transforms(name, True, True),
                         transforms(name, False, True))
    return train, test, len(train.classes)


# --------------------------------------------------------------------------- the decode cache

_decode = read_image  # one file -> uint8 (3, 32, 32); a module global so tests can count calls


def _decode_all(samples: list[tuple[str, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Images uint8 (N, 3, 32, 32) and labels int64 (N,) of ``samples`` (path, label)."""
    images = torch.empty(len(samples), 3, 32, 32, dtype=torch.uint8)
    for i, (path, _) in enumerate(samples):
        images[i] = _decode(path)
    return images, _labels(samples)


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


def _is(value, kind: type, expected) -> bool:
    """``value == expected`` for a value of type ``kind`` only: a hostile cache may hold a tensor
    where a string belongs, and ``tensor == str`` is no bool."""
    return isinstance(value, kind) and not isinstance(value, bool) and value == expected


def _verified_cache(path: Path, key: str, classes: list[str],
                    labels: dict[str, torch.Tensor]) -> dict | None:
    """The cache at ``path`` if it holds this listing's images; None if it is another listing's
    (the folder changed: stale, not broken). Anything else raises CheckpointError (one line)."""
    def bad(what: str) -> CheckpointError:
        return CheckpointError(f"{shown(path)}: {what}")

    if path.is_symlink():  # we write regular files; a link may lead to /dev/zero or a FIFO
        raise bad("a symbolic link, not a file this toolkit wrote")
    blob = read_file(path)  # bounded weights_only load; every failure is a CheckpointError
    if not isinstance(blob, dict) or not _is(blob.get("format"), str, CACHE_FORMAT):
        raise bad("not a slimming decoded-image cache")
    if not _is(blob.get("version"), int, CACHE_VERSION) or not _is(blob.get("key"), str, key):
        return None
    if not isinstance(blob.get("checksum"), str):
        raise bad("no checksum")
    verify_checksum(blob, path)
    found = blob.get("classes")
    if not (isinstance(found, list) and all(isinstance(c, str) for c in found) and found == classes):
        raise bad("its classes are not the folder's class folders")
    for split in ("train", "test"):
        x, y, want = blob.get(f"{split}_images"), blob.get(f"{split}_labels"), labels[split]
        n = len(want)
        if not (isinstance(x, torch.Tensor) and x.dtype == torch.uint8 and x.shape == (n, 3, 32, 32)):
            raise bad(f"its {split}_images are not uint8 ({n}, 3, 32, 32)")
        if not (isinstance(y, torch.Tensor) and y.dtype == torch.int64 and y.shape == (n,)):
            raise bad(f"its {split}_labels are not int64 ({n},)")
        if n and (int(y.min()) < 0 or int(y.max()) >= len(classes)):
            raise bad(f"its {split}_labels fall outside [0, {len(classes)})")
        if not torch.equal(y, want):
            raise bad(f"its {split}_labels are not the folder's")
    return blob


def _read_cache(path: Path, key: str, classes: list[str], labels: dict[str, torch.Tensor]) -> dict | None:
    """The valid cache at ``path``, else None (to be rebuilt); an invalid one is said so in one
    line on stderr."""
    if not os.path.lexists(path):
        return None
    try:
        return _verified_cache(path, key, classes, labels)
    except (CheckpointError, OSError) as e:
        reason = e if isinstance(e, CheckpointError) else f"{shown(path)}: {e.strerror}"
        print(f"slimming: the decoded-image cache is invalid and is being rebuilt: {reason}",
              file=sys.stderr)
        return None


def decode_imagefolder(root: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> dict:
    """Decode ``root/train/<class>/*`` and ``root/test/<class>/*`` once, cached in ``cache_dir``
    (default ``~/.cache/slimming/decoded``) under a key of the folder's path and its files'
    names, sizes and mtimes: any change to the folder rebuilds the cache. A cache is used only
    after its checksum, shapes, classes and labels are verified; a cache file that cannot be
    written (a folder in the way, a read-only disk) only costs decoding again next time.

    Returns ``{"classes": [...] (ImageFolder's order), "train_images": uint8 (N, 3, 32, 32),
    "train_labels": int64 (N,), "test_images": ..., "test_labels": ...}``.
    """
    root = Path(root)
    classes, train, test = _list_imagefolder(root)
    key = _listing_key(root, train + test)
    cache_dir = Path(cache_dir) if cache_dir is not None else default_root().parent / "decoded"
    path = cache_dir / f"imagefolder-{hashlib.sha256(os.fsencode(root.resolve())).hexdigest()[:16]}.pt"
    blob = _read_cache(path, key, classes, {"train": _labels(train), "test": _labels(test)})
    if blob is not None:
        return blob
    start = time.perf_counter()
    train_images, train_labels = _decode_all(train)
    test_images, test_labels = _decode_all(test)
    # said after the fact: a bad image found half-way is then the only line the user sees
    print(f"slimming: decoded {len(train) + len(test):,} images of {shown(root)} in "
          f"{time.perf_counter() - start:.1f} s, cached in {shown(path)}", file=sys.stderr)
    blob = {"format": CACHE_FORMAT, "version": CACHE_VERSION, "key": key, "classes": classes,
            "train_images": train_images, "train_labels": train_labels,
            "test_images": test_images, "test_labels": test_labels}
    from .checkpoint import save_checkpoint

    try:
        save_checkpoint(blob, path)
    except OSError as e:  # a read-only or full disk, a folder in the way: decode again next time
        print(f"slimming: cannot write the decoded-image cache {shown(path)} "
              f"({e.strerror or first_line(e)}); the next run decodes again", file=sys.stderr)
    return blob


def load_images(name: str, root: str | os.PathLike | None = None, download: bool = False,
                cache_dir: str | os.PathLike | None = None):
    """The whole dataset as tensors: ``(train_images uint8 (N, 3, 32, 32), train_labels int64
    (N,), test_images (M, 3, 32, 32), test_labels (M,), num_classes)``."""
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
                  rank: int = 0, world_size: int = 1, cache_dir: str | os.PathLike | None = None):
    """(train loader, test loader, number of classes) for this ``rank`` of ``world_size``.

    ``loader="fast"``: two TensorLoaders holding the data on ``device`` (``workers`` and
    ``pin_memory`` unused). ``loader="torchvision"``: Dataset + DataLoader with ``workers``
    processes; under DDP a DistributedSampler for training and a strided, unpadded test shard.
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
    # a batch larger than the set is the whole set: the same batches, and DataLoader's sampler
    # cannot even take a batch size above sys.maxsize
    if loader == "fast":
        train_x, train_y, test_x, test_y, num_classes = load_images(name, root, download, cache_dir)
        mean, std = STATS.get(name, STATS["cifar10"])
        common = dict(mean=mean, std=std, seed=seed, device=device, rank=rank, world_size=world_size)
        return (TensorLoader(train_x, train_y, min(batch_size, len(train_y)), train=True, **common),
                TensorLoader(test_x, test_y, min(test_batch, len(test_y)), train=False, **common),
                num_classes)
    train, test, num_classes = build_datasets(name, root, download)
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
    return train_loader, test_loader, num_classes
