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
An image folder is listed and read by ``slimming.data.images`` (each file's size checked from its
header before it is decoded, symlink loops not followed). What its headers say and its measured
mean and std are cached in a small checksummed file; for the fast loader its pixels are decoded
once and cached as a checksummed ``.pt`` file. Both are verified before every use and keyed by
the folder's listing, so a changed folder is read again. ``--data-root`` may also name an image
pack (``slimming.data.packed``: the folder's JPEGs in one file), decoded once on the training device
(nvJPEG on CUDA) by the fast loader, which alone serves it.

What was chosen (image size, recipe, mean and std, loader) is ``DataInfo``, the ``info``
attribute of every loader and dataset built here: store ``info.as_dict()`` in a checkpoint.
Imports torchvision only when called.

Sources are records (``Source``, in ``SOURCES``: ``--dataset NAME``); the layout of the data
part is in ``slimming/data/__init__.py``.
"""

from __future__ import annotations

import math
import operator
import os
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import Dataset, DistributedSampler, Subset

from ..errors import DataError, clip, first_line
from ..utils.files import human_bytes
from .imagefolder import (
    FolderInfo,
    ImageFiles,
    decoded_images,
    default_root,
    folder_stats,
    list_folder,
    measure_images,
    scan_folder,
)
from .images import MAX_PIXELS, shown
from .loaders import EpochDataLoader, TensorLoader, check_rank, pick_seed
from .packed import Pack, decode_pack, read_pack
from .recipes import (
    IMAGENET_STATS,
    LARGE_SIZE,
    SMALL_SIZE,
    STATS,
    DataInfo,
    make_transform,
    resize_for,
)

LOADERS = ("fast", "torchvision")
NORMS = ("dataset", "imagenet")
FAST_LIMIT = 4 * 2**30  # the fast loader holds at most this many decoded bytes (and 1/4 of RAM)


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


# --------------------------------------------------------------------------- sources

@dataclass(frozen=True)
class Source:
    """One dataset, looked up by ``name`` in ``SOURCES`` (``--dataset NAME``); adding one is
    adding a record with ``add_source``.

    A built-in source holds ``count`` images (train + test) of ``size`` x ``size`` and says how
    to get them: ``tensors(root, download)`` -> (train images uint8 (N, 3, H, W), train labels
    int64 (N,), test images, test labels, number of classes) for the fast loader, and
    ``datasets(root, download, pipeline)`` -> (train set, test set, number of classes) for the
    DataLoader path, where ``pipeline(train, from_pil)`` is the per-image transform. ``stats``:
    its (mean, std) for ``norm="dataset"``. A ``files`` source (the image folder, or an image
    pack) is read from the user's files under ``root`` (which it then needs) by
    ``slimming.data.imagefolder`` and ``slimming.data.packed``."""

    name: str
    tensors: Callable | None = None
    datasets: Callable | None = None
    count: int = 0
    size: int = SMALL_SIZE
    stats: tuple | None = None
    files: bool = False


SOURCES: dict[str, Source] = {}
DATASETS = SOURCES  # the names --dataset takes (a tuple of them before 0.2)


def add_source(source: Source) -> Source:
    """Register ``source`` under its name (a DataError if the name is taken)."""
    if source.name in SOURCES:
        raise DataError(f"the dataset name {source.name!r} is taken", param="name")
    SOURCES[source.name] = source
    return source


def _cifar_tensors(name: str):
    def tensors(root: Path, download: bool):
        train, test = _cifar(name, root, download)

        def nchw(ds) -> tuple[torch.Tensor, torch.Tensor]:  # .data is NumPy (N, 32, 32, 3) uint8
            return (torch.from_numpy(ds.data).permute(0, 3, 1, 2).contiguous(),
                    torch.tensor(ds.targets, dtype=torch.int64))

        return *nchw(train), *nchw(test), len(train.classes)

    return tensors


def _cifar_datasets(name: str):
    def datasets(root: Path, download: bool, pipeline):
        train, test = _cifar(name, root, download, pipeline(True, True), pipeline(False, True))
        return train, test, len(train.classes)

    return datasets


def _synthetic_tensors(root: Path, download: bool):
    return *synthetic_images(2560, split_seed=1), *synthetic_images(512, split_seed=2), 10


def _synthetic_datasets(root: Path, download: bool, pipeline):
    train = TensorImages(*synthetic_images(2560, split_seed=1), pipeline(True))
    test = TensorImages(*synthetic_images(512, split_seed=2), pipeline(False))
    return train, test, 10


for _name in ("cifar10", "cifar100"):
    add_source(Source(_name, _cifar_tensors(_name), _cifar_datasets(_name), 60000, stats=STATS[_name]))
add_source(Source("imagefolder", files=True))
add_source(Source("synthetic", _synthetic_tensors, _synthetic_datasets, 2560 + 512, stats=STATS["cifar10"]))


def source(name: str) -> Source:
    if name not in SOURCES:
        raise DataError(f"unknown dataset {clip(name)}; choose one of: {', '.join(SOURCES)}", param="name")
    return SOURCES[name]


def _count(param: str, value, least: int) -> int:
    """``value`` as an int >= ``least``, else a DataError naming ``param``."""
    try:
        n = operator.index(value)  # int or NumPy integer; no float, no bool
    except TypeError:
        n = None
    if n is None or isinstance(value, bool) or n < least:
        raise DataError(f"{param} must be an integer >= {least}, got {clip(value)}", param=param)
    return n


def _resolve_root(name: str, root) -> Path:
    if root is None:
        if source(name).files:
            raise DataError(f"the {name} dataset needs root, a folder holding train/ and test/ "
                            "(or val/)", param="root")
        return default_root()
    return Path(root)


def _image_size(value) -> int | None:
    """``value`` (None, or an int >= 1 whose square is at most MAX_PIXELS), else a DataError."""
    if value is None:
        return None
    n = _count("image_size", value, 1)
    if n * n > MAX_PIXELS:
        raise DataError(f"image_size {n} makes images of more than {MAX_PIXELS:,} pixels; "
                        f"choose at most {math.isqrt(MAX_PIXELS)}", param="image_size")
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
                        f"with std > 0; got {clip(norm)}")
    return "given", mean, std


_CIFAR_FOLDERS = {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python"}  # torchvision's


def _cifar(name: str, root: Path, download: bool, train_transform=None, test_transform=None):
    if not download and not (Path(root) / _CIFAR_FOLDERS[name]).is_dir():
        _cifar_missing(name, root)  # said before torchvision is imported (a second, for nothing)
    from torchvision import datasets

    cls = datasets.CIFAR10 if name == "cifar10" else datasets.CIFAR100
    try:  # torchvision checks each file's MD5 before unpickling it: a tampered file is refused
        train = cls(str(root), train=True, download=download, transform=train_transform)
        test = cls(str(root), train=False, download=download, transform=test_transform)
    except RuntimeError:
        _cifar_missing(name, root)
    except OSError as e:  # a download that cannot reach the network
        raise DataError(f"{name}: download failed ({first_line(e)}); point root at a local copy "
                        "or use the imagefolder or synthetic dataset", param="root") from None
    return train, test


def _cifar_missing(name: str, root: Path):
    raise DataError(f"{name} not found under {root}: pass download to fetch it, point root at a "
                    "folder that holds it, or use a local copy as the imagefolder dataset, or "
                    "the synthetic one", param=("download", "root")) from None


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
        return (f"{count:,} images of {n}x{n} would take {human_bytes(nbytes)} decoded, over the fast "
                f"loader's limit of {human_bytes(limit)} here")
    return None


@dataclass
class Plan:
    """What ``build_loaders``/``build_datasets`` settle before reading any pixel: the source
    ``name``, its ``root``, its files (an image folder's ``FolderInfo`` or a ``Pack``; None for
    a built-in source), the image ``sizes`` ((w, h) -> count), the side ``image_size`` the
    batches have, the shorter side to ``resize`` to (None: used as they are) and ``norm``
    (kind, mean, std; mean None: still to be measured)."""

    name: str
    root: Path
    download: bool
    cache_dir: str | os.PathLike | None
    folder: FolderInfo | Pack | None
    sizes: Counter
    image_size: int
    resize: int | None
    norm: tuple


def plan(name: str, root, download: bool, cache_dir, image_size, norm, limit=None) -> Plan:
    """The ``Plan`` for the arguments of ``build_loaders``/``build_datasets``; an image folder's
    headers are all read (or their cached sizes) here, a pack's index (``slimming.data.packed``:
    a file, not a folder). ``limit``: the first N images of each class of an image folder."""
    root = _resolve_root(name, root)
    image_size, norm = _image_size(image_size), _norm(norm)
    data = source(name)
    if limit is not None:
        limit = _count("limit", limit, 1)
        if not data.files or os.path.isfile(root):
            what = "an image pack" if data.files else name
            raise DataError(f"limit takes the first images of each class of an image folder; {what} is "
                            "read whole", param="limit")
    if data.files:
        folder = read_pack(root) if os.path.isfile(root) else scan_folder(list_folder(root, limit), cache_dir)
        sizes = folder.sizes
    else:  # its images are all size x size: that, unless asked otherwise
        folder, sizes = None, Counter({(data.size, data.size): data.count})
        image_size = image_size or data.size
    kind, mean, std = norm
    if kind == "dataset" and folder is None:
        mean, std = data.stats
    return Plan(name, root, download, cache_dir, folder, sizes, *_choose_size(sizes, image_size),
                (kind, mean, std))


# --------------------------------------------------------------------------- datasets

def _datasets(p: Plan, workers: int, say: bool):
    """(train set, test set, number of classes, DataInfo) for the DataLoader path."""
    root, folder, image_size, resize = p.root, p.folder, p.image_size, p.resize
    if isinstance(folder, Pack):
        raise DataError(f"{shown(root)}: an image pack is read by the fast loader only (loader "
                        "fast, its images at their own size); for the DataLoader path use the folder",
                        param="loader")
    kind, mean, std = p.norm
    if folder is not None and mean is None:
        mean, std = folder_stats(folder, image_size, resize, workers=workers, say=say)
    info = DataInfo(image_size, resize, tuple(mean), tuple(std), kind, "torchvision",
                    folder.listing.test_split if folder is not None else "test")

    def pipeline(train: bool, from_pil: bool = False):
        return make_transform(image_size, resize, mean, std, train, from_pil)

    if folder is not None:
        listing = folder.listing
        train = ImageFiles(listing.classes, listing.train, pipeline(True))
        test = ImageFiles(listing.classes, listing.test, pipeline(False))
        num_classes = len(listing.classes)
    else:
        train, test, num_classes = source(p.name).datasets(root, p.download, pipeline)
    train.info = test.info = info
    return train, test, num_classes, info


def build_datasets(name: str, root: str | os.PathLike | None = None, download: bool = False, *,
                   image_size: int | None = None, norm="dataset",
                   cache_dir: str | os.PathLike | None = None, workers: int = 0, limit: int | None = None):
    """(train set, test set, number of classes) for dataset ``name`` under ``root``, items
    ``(float32 (3, N, N), label)``; both sets' ``info`` is the ``DataInfo`` they were made with.
    ``image_size`` N (None: 32 when every image is 32x32, else 224) and ``norm`` ("dataset",
    "imagenet" or a pair (mean, std)) as for ``build_loaders``. An image folder's files are all
    checked from their headers here (tens of microseconds each; remembered in ``cache_dir`` for
    an unchanged folder, as its measured mean and std are), so a bad one stops the run now, not
    in the middle of an epoch. ``workers`` processes read the images whose mean and std are
    measured. ``limit``: only the first N images of each class in each split of an image folder
    (as ``build_loaders``)."""
    workers = _count("workers", workers, 0)
    return _datasets(plan(name, root, download, cache_dir, image_size, norm, limit), workers, True)[:3]


# --------------------------------------------------------------------------- whole datasets as tensors

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
    return decoded_images(list_folder(Path(root)), cache_dir)


def load_images(name: str, root: str | os.PathLike | None = None, download: bool = False,
                cache_dir: str | os.PathLike | None = None):
    """The whole dataset as tensors at its own size: ``(train_images uint8 (N, 3, H, W),
    train_labels int64 (N,), test_images (M, 3, H, W), test_labels (M,), num_classes)``; H = W
    = 32 but for an image folder or pack, whose images must all be of one size."""
    root = _resolve_root(name, root)
    if source(name).files:
        b = decode_pack(root) if os.path.isfile(root) else decode_imagefolder(root, cache_dir)
        return b["train_images"], b["train_labels"], b["test_images"], b["test_labels"], len(b["classes"])
    return source(name).tensors(root, download)


# --------------------------------------------------------------------------- loaders

def build_loaders(name: str, root: str | os.PathLike | None = None, batch_size: int = 64,
                  workers: int = 0, download: bool = False, seed: int | None = None,
                  pin_memory: bool = False, loader: str = "fast", device: str | torch.device = "cpu",
                  rank: int = 0, world_size: int = 1, cache_dir: str | os.PathLike | None = None,
                  image_size: int | None = None, norm="dataset", limit: int | None = None):
    """(train loader, test loader, number of classes) for this ``rank`` of ``world_size``.
    Batches are float32 (B, 3, N, N), N = ``image_size``; both loaders' ``info`` is the
    ``DataInfo`` saying how they were made (N, recipe, mean and std, loader).

    ``image_size``: None picks 32 when every image (train and test, from their headers) is
    32x32, else 224. Images that are all NxN are padded, cropped and flipped as CIFAR's; any
    others are resized (RandomResizedCrop for training, resize + centre crop for evaluation).
    ``norm``: "dataset" (CIFAR's and the synthetic set's constants; an image folder's training
    images measured once, cached), "imagenet", or an explicit ``(mean, std)`` pair (say, the one
    a checkpoint recorded). ``limit``: only the first N images of each class, in each split, of
    an image folder (in its sorted order: a quick try on part of a real folder); a DataError for
    another source.

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
    check_rank(rank, world_size)
    batch_size, workers = _count("batch_size", batch_size, 1), _count("workers", workers, 0)
    seed = pick_seed(seed, world_size)
    test_batch = max(256, batch_size)
    say = rank == 0
    p = plan(name, root, download, cache_dir, image_size, norm, limit)
    if loader == "fast":
        why = _not_fast(p.sizes, p.image_size, p.resize)
        if why is None:
            return _fast_loaders(p, batch_size, test_batch, seed, device, rank, world_size, say)
        if isinstance(p.folder, Pack):
            raise DataError(f"{shown(p.root)}: an image pack is read by the fast loader only, but {why}")
        if say:
            print(f"slimming: {why}; using the DataLoader path with --workers {workers}", file=sys.stderr)
    # a batch larger than the set is the whole set: the same batches, and DataLoader's sampler
    # cannot even take a batch size above sys.maxsize
    train, test, num_classes, info = _datasets(p, workers, say)
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


def _fast_loaders(p: Plan, batch_size: int, test_batch: int, seed: int, device, rank: int,
                  world_size: int, say: bool):
    """Two TensorLoaders (images all NxN already, pad-and-crop recipe)."""
    folder, image_size = p.folder, p.image_size
    kind, mean, std = p.norm
    pack, split = isinstance(folder, Pack), "test"
    if folder is not None:  # a pack is decoded on the training device itself (nvJPEG on CUDA)
        blob = (decode_pack(p.root, device) if pack
                else decoded_images(folder.listing, p.cache_dir, (image_size, image_size)))
        train_x, train_y, test_x, test_y = (blob[k] for k in ("train_images", "train_labels",
                                                               "test_images", "test_labels"))
        num_classes = len(blob["classes"])
        if mean is None and pack:
            mean, std, _ = measure_images(train_x)
        elif mean is None:
            mean, std = folder_stats(folder, image_size, None, images=train_x, say=say)
        split = folder.test_split if pack else folder.listing.test_split
    else:
        train_x, train_y, test_x, test_y, num_classes = load_images(p.name, p.root, p.download)
    info = DataInfo(image_size, None, tuple(mean), tuple(std), kind, "fast", split)
    common = dict(mean=mean, std=std, seed=seed, device=device, rank=rank, world_size=world_size,
                  padding=info.padding)
    train = TensorLoader(train_x, train_y, min(batch_size, len(train_y)), train=True, **common)
    test = TensorLoader(test_x, test_y, min(test_batch, len(test_y)), train=False, **common)
    train.info = test.info = info
    return train, test, num_classes
