"""An image folder ``root/train/<class>/*`` + ``root/test/<class>/*`` (or ``root/val/...``):
listing it, reading it one image at a time (``ImageFiles``), and its two caches.

- The information cache (``.info``, ``scan_folder``, ``folder_stats``): the image sizes the headers
  claim, and the training images' mean and std measured at each image size.
- The decode cache (``.pt``, ``decoded_images``): every image decoded once into uint8 tensors for the
  fast loader.

Both are checksummed files under ``default_root().parent / "decoded"`` (or a given folder),
verified before every use and keyed by the folder's listing (``_listing_key``: names, labels,
sizes, mtimes) and, for the decoded images, by every file's bytes too (``content_key``), so a
changed folder is read again; one that cannot be written only costs the work again next time. Files are
read by ``slimming.data.images`` (each header checked before decoding, symlink loops not followed).
Its own module because it is the part of the input pipeline that touches files and caches.
``default_root`` (where CIFAR is downloaded by default) lives here too: the caches' default
folder is beside it, and ``data`` imports it from here.

Layering: ``recipes`` <- this module <- ``data``; it imports ``recipes`` (``make_transform``),
``images``, ``safeload`` and ``errors`` (``checkpoint`` only when writing a cache), never
``data`` or ``loaders``. Tests that count decodes, header reads or measurements monkeypatch
``_decode``, ``check_image``, ``_measure`` and ``STATS_IMAGES`` here, where they are used.
"""

from __future__ import annotations

import hashlib
import math
import os
import stat
import sys
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from ..errors import CheckpointError, DataError, first_line
from ..utils.files import human_bytes
from ..utils.safeload import read_file, save_checked, verify_checksum
from .images import MAX_PIXELS, check_image, list_images, read_image, shown
from .recipes import make_transform

STATS_IMAGES = 3000  # an image folder's mean and std are measured on at most this many images
STATS_SEED = 0  # ... drawn with this seed
# version 2: images read by slimming.data.images (PIL; 16-bit scaled as v >> 8, no longer wrapped)
CACHE_FORMAT, CACHE_VERSION = "slimming-decoded", 2
INFO_FORMAT, INFO_VERSION = "slimming-imagefolder-info", 1


def default_root() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "slimming" / "data"


# --------------------------------------------------------------------------- listing and reading

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


def _what_is(path: Path) -> str:
    """What a path that is not a folder is, for a message: "no such folder", "a FIFO, not a
    folder", ..."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return "no such folder"
    kinds = [(stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISREG, "a file")]
    return next((f"{name}, not a folder" for test, name in kinds if test(mode)), "not a folder")


def _list_imagefolder(root: Path) -> tuple[list[str], list[tuple[str, int]], list[tuple[str, int]], str]:
    """``(classes, train samples, test samples, test split name)`` of ``root/train/<class>/...``
    and ``root/test/<class>/...`` (or ``root/val/...`` when there is no test/), listed as
    ImageFolder does (``slimming.data.images.list_images``); samples are (path, label)."""
    if not root.is_dir():
        what = _what_is(root)
        raise DataError(f"{shown(root)}: {what}; root must be a folder holding "
                        "train/<class>/<image> and test/<class>/<image> (or val/<class>/<image>), "
                        "or an image pack", param="root")
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
class Listing:
    """An image folder's splits as listed now, and the key of that listing (``_listing_key``)."""

    root: Path
    classes: list[str]
    train: list[tuple[str, int]]
    test: list[tuple[str, int]]
    test_split: str
    key: str


def list_folder(root: Path, limit: int | None = None) -> Listing:
    """The folder's splits; ``limit``: only the first ``limit`` images of each class in each
    split, in the listing's (sorted) order, for a quick try on part of a real folder."""
    classes, train, test, split = _list_imagefolder(root)
    if limit is not None:
        train, test = _first_of_each_class(train, limit), _first_of_each_class(test, limit)
    return Listing(root, classes, train, test, split, _listing_key(root, train + test))


def _first_of_each_class(samples: list[tuple[str, int]], limit: int) -> list[tuple[str, int]]:
    seen: Counter = Counter()
    kept = []
    for path, label in samples:
        if seen[label] < limit:
            seen[label] += 1
            kept.append((path, label))
    return kept


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


def content_key(listing: Listing) -> str:
    """The listing's key and a hash of every file's bytes: the decode cache's key. Sizes and
    mtimes alone miss two same-size images swapped with their mtimes kept (``cp -p``, an
    archive unpacked), and the decoded images would then answer for the wrong labels. Reading
    the bytes again costs a second or two for CIFAR-10's 52 MiB, against about 20 s to decode
    them; the decode cache serves folders that fit in memory, so this stays bounded."""
    h = hashlib.blake2b(listing.key.encode(), digest_size=32)
    for path, _ in sorted(listing.train + listing.test):
        try:
            # O_NONBLOCK as in slimming.data.images: a FIFO put there since the scan cannot block this
            with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as f:
                h.update(hashlib.blake2b(f.read(), digest_size=16).digest())
        except OSError as e:
            raise DataError(f"{shown(path)}: cannot read it ({e.strerror}); fix or remove it") from None
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
    raises DataError (one line)."""
    if path.is_symlink():  # we write regular files; a link may lead to /dev/zero or a FIFO
        raise DataError(f"{shown(path)}: a symbolic link, not a file this toolkit wrote")
    try:
        blob = read_file(path)  # bounded weights_only load; every failure is a CheckpointError
    except CheckpointError as e:
        raise DataError(str(e)) from None
    if not isinstance(blob, dict) or not _is(blob.get("format"), str, fmt):
        raise DataError(f"{shown(path)}: not a slimming {what} cache")
    if not _is(blob.get("version"), int, version) or not _is(blob.get("key"), str, key):
        return None
    if not isinstance(blob.get("checksum"), str):
        raise DataError(f"{shown(path)}: no checksum")
    try:
        verify_checksum(blob, path)
    except CheckpointError as e:
        raise DataError(str(e)) from None
    return blob


def _read_cache(path: Path, verify, what: str):
    """``verify()``: the valid cache at ``path``, else None (to be rebuilt); an invalid one is
    said so in one line on stderr."""
    if not os.path.lexists(path):
        return None
    try:
        return verify()
    except (DataError, OSError) as e:
        reason = e if isinstance(e, DataError) else f"{shown(path)}: {e.strerror}"
        print(f"slimming: the {what} cache is invalid and is being rebuilt: {reason}", file=sys.stderr)
        return None


def _write_cache(blob: dict, path: Path, what: str, consequence: str) -> None:
    try:
        save_checked(blob, path)
    except OSError as e:  # a read-only or full disk, a folder in the way: do it again next time
        print(f"slimming: cannot write the {what} cache {shown(path)} "
              f"({e.strerror or first_line(e)}); {consequence}", file=sys.stderr)


# --------------------------------------------------------------------------- what the headers say

@dataclass
class FolderInfo:
    """An image folder's listing, the sizes its headers claim ((width, height) -> number of
    images, train and test) and the statistics measured so far (image size -> {"images",
    "mean", "std"}), kept in the information cache ``path``."""

    listing: Listing
    sizes: Counter
    stats: dict
    path: Path


def _info_blob(folder: FolderInfo) -> dict:
    rows = sorted((w, h, n) for (w, h), n in folder.sizes.items())
    return {"format": INFO_FORMAT, "version": INFO_VERSION, "key": folder.listing.key,
            "sizes": torch.tensor(rows, dtype=torch.int64).reshape(-1, 3),
            "stats": [{"image_size": size, "images": e["images"], "mean": list(e["mean"]),
                       "std": list(e["std"])} for size, e in sorted(folder.stats.items())]}


def _floats(value, low: float, high: float, low_open: bool = False) -> bool:
    return (isinstance(value, list) and len(value) == 3
            and all(isinstance(v, float) and math.isfinite(v) and low <= v <= high
                    and not (low_open and v == low) for v in value))


def _verified_info(path: Path, listing: Listing) -> tuple[Counter, dict] | None:
    """``(sizes, stats)`` from the information cache at ``path`` if it is this listing's, else
    None; an invalid one raises DataError."""
    def bad(what: str) -> DataError:
        return DataError(f"{shown(path)}: {what}")

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


def scan_folder(listing: Listing, cache_dir) -> FolderInfo:
    """The sizes of every image of ``listing`` from their headers (each file checked: a bad one
    stops the run now, not in the middle of an epoch), read once and cached with the listing's
    key: an unchanged folder is not read again."""
    path = _cache_file(listing.root, cache_dir, ".info")
    found = _read_cache(path, lambda: _verified_info(path, listing), "image-information")
    if found is not None:
        return FolderInfo(listing, *found, path)
    sizes = Counter(check_image(p) for p, _ in listing.train + listing.test)
    folder = FolderInfo(listing, sizes, {}, path)
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


def measure_images(images: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...], int]:
    """``_measure`` of the fixed sample (``_stats_sample``) of decoded uint8 images (N, 3, H, W)
    on any device (the sample is counted on the CPU)."""
    index = _stats_sample(len(images))
    return _measure(images[index[i:i + 256].to(images.device)].cpu() for i in range(0, len(index), 256))


def folder_stats(folder: FolderInfo, image_size: int, resize: int | None, *, workers: int = 0,
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
        mean, std, n = measure_images(images)
    else:
        transform = None if resize is None else make_transform(image_size, resize, (), (), False,
                                                               normalize=False)
        files = ImageFiles(folder.listing.classes, [train[i] for i in index.tolist()], transform)
        loader = DataLoader(files, batch_size=64, num_workers=workers if len(files) >= 512 else 0)
        mean, std, n = _measure(x for x, _ in loader)
    folder.stats[image_size] = {"images": n, "mean": mean, "std": std}
    _write_cache(_info_blob(folder), folder.path, "image-information", "the next run measures again")
    if say:
        print(f"slimming: measured the mean ({', '.join(f'{v:.4f}' for v in mean)}) and std "
              f"({', '.join(f'{v:.4f}' for v in std)}) of {n:,} training images of "
              f"{shown(folder.listing.root)} at {image_size}x{image_size} in "
              f"{time.perf_counter() - start:.1f} s, cached in {shown(folder.path)}", file=sys.stderr)
    return mean, std


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
                            "(loader torchvision)", param="loader")
        images[i] = x
    return images, _labels(samples)


def _verified_cache(path: Path, key: str, classes: list[str], labels: dict[str, torch.Tensor],
                    size: tuple[int, int] | None = None) -> dict | None:
    """The cache at ``path`` if it holds this listing's images (all of ``size`` (H, W) when
    given, else of the training images' one size); None if it is another listing's (the folder
    changed: stale, not broken). Anything else raises DataError (one line)."""
    def bad(what: str) -> DataError:
        return DataError(f"{shown(path)}: {what}")

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


def decoded_images(listing: Listing, cache_dir, size: tuple[int, int] | None = None) -> dict:
    """``decode_imagefolder`` for a listing made already; ``size`` (H, W) the images must have."""
    path = _cache_file(listing.root, cache_dir, ".pt")
    labels = {"train": _labels(listing.train), "test": _labels(listing.test)}
    key = content_key(listing)
    blob = _read_cache(path, lambda: _verified_cache(path, key, listing.classes, labels, size),
                       "decoded-image")
    if blob is not None:
        return blob
    start = time.perf_counter()
    train_images, train_labels = _decode_all(listing.train, size)
    test_images, test_labels = _decode_all(listing.test, tuple(train_images.shape[2:]))
    # said after the fact: a bad image found half-way is then the only line the user sees
    size = human_bytes(train_images.nbytes + test_images.nbytes)
    print(f"slimming: decoded {len(listing.train) + len(listing.test):,} images of "
          f"{shown(listing.root)} in {time.perf_counter() - start:.1f} s, cached in {shown(path)} "
          f"({size}; delete it to free the space, the next run decodes again)", file=sys.stderr)
    blob = {"format": CACHE_FORMAT, "version": CACHE_VERSION, "key": key,
            "classes": listing.classes, "train_images": train_images, "train_labels": train_labels,
            "test_images": test_images, "test_labels": test_labels}
    _write_cache(blob, path, "decoded-image", "the next run decodes again")
    return blob
