"""An image pack: an ImageFolder-layout folder of JPEGs in one file, their bytes as they are.

Made to travel (one file, not 60,000) and to be decoded once by the fast loader: on CUDA by
nvJPEG, batched (torchvision's ``decode_jpeg(list, device="cuda")``); on the CPU by PIL in a
thread pool, with ``images.read_image``'s decoder and conversion, so that there a pack gives
exactly the folder's pixels (nvJPEG's IDCT and upsampling are not libjpeg's: on CUDA a pixel may
differ by a level or two). ``pack_folder`` takes JPEG files of one size only (anything else is
one DataError line): nvJPEG reads JPEG only, the fast loader holds images of one size.

Layout (version 1, little-endian): b"SLIMPACK", uint32 version, uint32 header bytes, the header
(UTF-8 JSON padded to 8 bytes: classes, test_split, train, test, height, width, data_bytes),
int64 offsets (N + 1), int64 labels (N), the N files' bytes (train, then test), and a 32-byte
BLAKE2b digest of everything before it. Reading checks, before allocating anything a claim sizes:
the magic, the version, the header's size and fields, that the file has exactly the bytes they
imply (a claim of 10**12 images stops there), offsets rising from 0 to data_bytes, labels in
range; then the digest, and every image's size from its JPEG header before it is decoded. Every
problem is one DataError line naming the file. No pickle, no ``torch.load``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import stat
import struct
import sys
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch

from ..errors import DataError, first_line
from ..utils.files import atomic_path
from .imagefolder import list_folder
from .images import MAX_PIXELS, bad_file_errors, check_image, pil_image, rgb8, shown

MAGIC, VERSION = b"SLIMPACK", 1
# bytes of JSON header a pack may have: 1,000 ImageNet class names take 10 KB; parsed, a hostile
# header of short strings costs about 10x its size in Python objects
MAX_HEADER = 2**20
PREFIX = struct.Struct("<8sII")  # magic, version, header bytes
DIGEST = 32
CHUNK = 4096  # images per batched CUDA decode: bounds the decoder's working memory
KEYS = {"classes", "test_split", "train", "test", "height", "width", "data_bytes"}
_SOF = set(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # start-of-frame markers: they hold the size


@dataclass
class Pack:
    """A pack's validated index: N = train + test images (train first), every one ``height`` x
    ``width``; ``labels`` int64 (N,); image i is data bytes ``offsets[i]:offsets[i + 1]`` (int64
    (N + 1,)); ``prefix``: the file's bytes before the images, hashed with them."""

    path: Path
    classes: list[str]
    test_split: str
    train: int
    test: int
    height: int
    width: int
    labels: torch.Tensor
    offsets: np.ndarray
    prefix: bytes

    @property
    def sizes(self) -> Counter:
        """(width, height) -> number of images, as ``slimming.data.imagefolder.FolderInfo.sizes``."""
        return Counter({(self.width, self.height): self.train + self.test})

    def name(self, i: int) -> str:
        """Image ``i`` for a message: split, index in it, class."""
        split, j = ("train", i) if i < self.train else (self.test_split, i - self.train)
        return f"{split} image {j} (class {shown(self.classes[int(self.labels[i])])})"


def _int(value, low: int, high: int = 2**63) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _index(f, path: Path, size: int) -> Pack:
    """The index of the pack open as ``f`` (``size`` bytes); leaves ``f`` at its images."""
    def bad(what: str) -> DataError:
        return DataError(f"{shown(path)}: {what}")

    head = f.read(PREFIX.size)
    if head[:len(MAGIC)] != MAGIC:
        raise DataError(f"{shown(path)}: neither a folder nor a slimming image pack (no SLIMPACK "
                        "magic); root must be a folder holding train/ and test/, or a pack made by "
                        "benchmarks/pack_images.py", param="root")
    if len(head) < PREFIX.size:
        raise bad("a truncated image pack")
    _, version, hlen = PREFIX.unpack(head)
    if version > VERSION:
        raise bad(f"an image pack of version {version}, newer than this slimming reads ({VERSION}); "
                  "update slimming or pack the folder again")
    if version < 1:
        raise bad(f"an image pack of unknown version {version}")
    if hlen > MAX_HEADER or PREFIX.size + hlen > size:
        raise bad(f"a truncated or damaged image pack (a header of {hlen:,} bytes in a file of {size:,})")
    raw = f.read(hlen)
    try:
        h = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise bad(f"a damaged image pack (its header is not JSON: {first_line(e, 80)})") from None
    if not (isinstance(h, dict) and set(h) == KEYS and isinstance(h["classes"], list)
            and h["classes"] and all(isinstance(c, str) for c in h["classes"])
            and len(set(h["classes"])) == len(h["classes"]) and h["test_split"] in ("test", "val")
            and _int(h["train"], len(h["classes"])) and _int(h["test"], 1) and _int(h["data_bytes"], 0)
            and _int(h["height"], 1, MAX_PIXELS) and _int(h["width"], 1, MAX_PIXELS)
            and h["height"] * h["width"] <= MAX_PIXELS):
        raise bad("a damaged image pack (its header lacks or garbles classes, test_split, train, "
                  "test, height, width or data_bytes)")
    n = h["train"] + h["test"]
    want = PREFIX.size + hlen + 8 * (2 * n + 1) + h["data_bytes"] + DIGEST
    if want != size:  # checked before any array is read: a claim of 10**12 images stops here
        raise bad(f"a truncated or damaged image pack: its header implies {want:,} bytes, the file "
                  f"has {size:,}")
    arrays = f.read(8 * (2 * n + 1))
    if len(arrays) != 8 * (2 * n + 1):
        raise bad("truncated while it was read (changed under us?)")
    offsets = np.frombuffer(arrays, "<i8", n + 1).astype(np.int64)
    labels = np.frombuffer(arrays, "<i8", n, 8 * (n + 1)).astype(np.int64)
    if (offsets[0] != 0 or offsets[-1] != h["data_bytes"] or (offsets < 0).any()
            or (offsets > h["data_bytes"]).any() or (np.diff(offsets) < 4).any()):  # no wrap-around
        raise bad("a damaged image pack (its offsets do not cut its data into images)")
    if (labels < 0).any() or (labels >= len(h["classes"])).any():
        raise bad(f"a damaged image pack (labels outside [0, {len(h['classes'])}))")
    return Pack(path, h["classes"], h["test_split"], h["train"], h["test"], h["height"], h["width"],
                torch.from_numpy(labels), offsets, head + raw + arrays)


@contextlib.contextmanager
def _opened(path: str | os.PathLike) -> Iterator[tuple[Pack, BinaryIO]]:
    """``(index, file)`` of the pack at ``path``, a regular file (a FIFO is refused, not waited on)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise DataError(f"{shown(path)}: cannot read it ({e.strerror})") from None
    with open(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise DataError(f"{shown(path)}: not an image pack (not a regular file)")
        yield _index(f, Path(path), st.st_size), f


def read_pack(path: str | os.PathLike) -> Pack:
    """The validated index of the pack at ``path`` (its images are read by ``decode_pack``)."""
    with _opened(path) as (pack, _):
        return pack


def _jpeg_size(b: memoryview) -> tuple[int, int] | None:
    """``(height, width)`` from the first start-of-frame marker of JPEG bytes ``b``, as libjpeg
    finds it (segments skipped by their lengths); None if there is none before the scan."""
    i, n = 2, len(b)
    if b[:3] != b"\xff\xd8\xff":
        return None
    while i + 4 <= n and b[i] == 0xFF:
        m = b[i + 1]
        if m == 0xFF:  # fill byte
            i += 1
        elif 0xD0 <= m <= 0xD7 or m == 0x01:  # standalone markers
            i += 2
        elif m in _SOF:
            return (b[i + 5] << 8 | b[i + 6], b[i + 7] << 8 | b[i + 8]) if i + 9 <= n else None
        elif m in (0xD8, 0xD9, 0xDA) or (b[i + 2] << 8 | b[i + 3]) < 2:
            return None
        else:
            i += 2 + (b[i + 2] << 8 | b[i + 3])
    return None


def _read_images(f: BinaryIO, pack: Pack) -> bytearray:
    """The pack's image bytes (``f`` is at them), after the digest of the whole file is checked."""
    data, h = bytearray(int(pack.offsets[-1])), hashlib.blake2b(pack.prefix, digest_size=DIGEST)
    # (update returns None; a byte past the digest would be a file grown since its size was read)
    if f.readinto(data) != len(data) or h.update(data) or h.digest() != f.read(DIGEST + 1):
        raise DataError(f"{shown(pack.path)}: corrupt: its contents do not match its checksum "
                        "(a damaged copy? copy or pack it again)")
    return data


def _decode_cpu(view: memoryview, pack: Pack, out: torch.Tensor) -> None:
    """Every image into ``out`` (N, 3, H, W) with PIL, as ``read_image`` decodes, in threads."""
    Image, errors, o = pil_image(), bad_file_errors(), pack.offsets

    def some(start: int, stop: int) -> None:
        for i in range(start, stop):
            try:
                with Image.open(io.BytesIO(view[o[i]:o[i + 1]]), formats=["JPEG"]) as im:
                    if im.size != (pack.width, pack.height):  # checked before, unless PIL disagrees
                        raise ValueError(f"PIL reads it as {im.size[0]}x{im.size[1]}")
                    out[i] = torch.from_numpy(rgb8(im)).permute(2, 0, 1)
            except errors as e:
                raise DataError(f"{shown(pack.path)}: {pack.name(i)}: cannot decode it "
                                f"({first_line(e)})") from None

    n = len(out)
    step = max(256, -(-n // 64))
    with ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool:  # PIL lets go of the GIL
        for job in [pool.submit(some, a, min(a + step, n)) for a in range(0, n, step)]:
            job.result()


def _decode_cuda(view: memoryview, pack: Pack, out: torch.Tensor) -> None:
    """Every image into ``out`` (on CUDA) with nvJPEG, ``CHUNK`` images a call."""
    from torchvision.io import ImageReadMode, decode_jpeg

    whole = torch.frombuffer(view, dtype=torch.uint8)
    for start in range(0, len(out), CHUNK):
        stop = min(start + CHUNK, len(out))
        inputs = [whole[pack.offsets[i]:pack.offsets[i + 1]] for i in range(start, stop)]
        try:
            with warnings.catch_warnings():  # deprecated for TorchCodec since torchvision 0.29
                warnings.simplefilter("ignore", DeprecationWarning)
                images = decode_jpeg(inputs, mode=ImageReadMode.RGB, device=out.device)
        except RuntimeError as e:
            raise DataError(f"{shown(pack.path)}: images {start} to {stop - 1} cannot be decoded on "
                            f"{out.device} ({first_line(e, 120)}); try device cpu", param="device") from None
        for i, x in enumerate(images, start):
            if x.shape != out.shape[1:]:
                raise DataError(f"{shown(pack.path)}: {pack.name(i)} decodes to {x.shape[2]}x"
                                f"{x.shape[1]} pixels on {out.device}, not {pack.width}x{pack.height}")
        torch.stack(images, out=out[start:stop])


def decode_pack(path: str | os.PathLike, device: str | torch.device = "cpu") -> dict:
    """Every image of the pack at ``path`` decoded once, on ``device`` (CUDA: nvJPEG, batched;
    otherwise PIL on the CPU, in threads, then moved). Returns what ``decode_imagefolder`` returns
    for the folder packed: ``{"classes": [...], "train_images": uint8 (N, 3, H, W),
    "train_labels": int64 (N,), "test_images": uint8 (M, 3, H, W), "test_labels": int64 (M,)}``,
    tensors on ``device``. Every problem is one DataError line."""
    device = torch.device(device)
    start_time = time.perf_counter()
    with _opened(path) as (pack, f):
        data = _read_images(f, pack)
    view = memoryview(data)
    for i in range(len(pack.labels)):  # every size from its JPEG header before anything is decoded
        found = _jpeg_size(view[pack.offsets[i]:pack.offsets[i + 1]])
        if found != (pack.height, pack.width):
            what = "is not a JPEG" if found is None else f"is {found[1]}x{found[0]} pixels"
            raise DataError(f"{shown(path)}: {pack.name(i)} {what}, but the pack's images are "
                            f"{pack.width}x{pack.height}")
    n, cuda = len(pack.labels), device.type == "cuda"
    images = torch.empty(n, 3, pack.height, pack.width, dtype=torch.uint8, device=device if cuda else "cpu")
    (_decode_cuda if cuda else _decode_cpu)(view, pack, images)
    images = images.to(device)
    print(f"slimming: decoded {n:,} images of {shown(path)} on {device} in "
          f"{time.perf_counter() - start_time:.1f} s", file=sys.stderr)
    labels = pack.labels.to(device)
    return {"classes": pack.classes, "train_images": images[:pack.train],
            "train_labels": labels[:pack.train], "test_images": images[pack.train:],
            "test_labels": labels[pack.train:]}


def pack_folder(folder: str | os.PathLike, out: str | os.PathLike) -> dict:
    """Pack the image folder ``folder`` (``train/<class>/*`` and ``test/`` or ``val/``, listed as
    ImageFolder lists it) into the file ``out``, written atomically. Every file must be a JPEG
    (by its content) and all of one size, checked from its header (``check_image``); else one
    DataError line naming the file. Returns ``{"path", "images", "bytes"}`` (the pack's size) and
    its header: ``classes``, ``test_split``, ``train``, ``test`` (counts), ``height``, ``width``,
    ``data_bytes``."""
    listing = list_folder(Path(folder))
    samples = listing.train + listing.test
    blobs, first = [], None
    for path, _ in samples:
        size = check_image(path)  # a regular file, an image format, at most MAX_PIXELS pixels
        blob = Path(path).read_bytes()
        if _jpeg_size(memoryview(blob)) != size[::-1]:  # a JPEG whose markers give its size
            raise DataError(f"{shown(path)}: not a JPEG file (as this reader takes them); a pack "
                            "holds JPEGs only, which decode on the GPU: convert it, or use the folder")
        first = first or (path, size)
        if size != first[1]:
            raise DataError(f"{shown(path)}: {size[0]}x{size[1]} pixels, but {shown(first[0])} is "
                            f"{first[1][0]}x{first[1][1]}; a pack holds images of one size")
        blobs.append(blob)
    offsets = np.concatenate([[0], np.cumsum([len(b) for b in blobs])])
    header = {"classes": listing.classes, "test_split": listing.test_split, "train": len(listing.train),
              "test": len(listing.test), "height": first[1][1], "width": first[1][0],
              "data_bytes": int(offsets[-1])}
    _write(out, header, offsets, [label for _, label in samples], blobs)
    return {"path": str(out), "images": len(samples), **header, "bytes": os.path.getsize(out)}


def _write(out, header: dict, offsets, labels, blobs: list[bytes], version: int = VERSION) -> None:
    """Write a pack of these parts, as they are, atomically (tests write hostile ones with it)."""
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    h = hashlib.blake2b(digest_size=DIGEST)  # over everything before it, as _read_images checks
    with atomic_path(out) as tmp, open(tmp, "wb") as f:
        for part in (PREFIX.pack(MAGIC, version, len(text)), text, np.asarray(offsets, "<i8").tobytes(),
                     np.asarray(labels, "<i8").tobytes(), *blobs):
            f.write(part)
            h.update(part)
        f.write(h.digest())
