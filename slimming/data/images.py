"""Reading image files safely: listing an image folder and decoding its images, of any size.

- ``list_images(folder)`` lists ``folder/<class>/**/<image>`` with torchvision ImageFolder's
  classes, order and extensions, following symlinks to folders elsewhere but never into a folder
  already listed or one above it (ImageFolder's ``os.walk(followlinks=True)`` lists a loop's
  images again at every level, exponentially with two loops).
- ``read_image(path)`` decodes one image of any size and mode into uint8 RGB (3, H, W) with PIL,
  after reading its size from the header: a header claiming more than ``MAX_PIXELS`` pixels (a
  small file claiming 60000x60000 pixels: a decompression bomb) is refused before anything is
  decoded. ``check_image(path)`` reads the header only and returns the size it claims.

Every problem is one ``ImageError`` line naming the file and what to do, also when it is raised
in a DataLoader worker process (see ``ImageError``).
"""

from __future__ import annotations

import heapq
import os
import re
import stat
import struct
import warnings
import zlib

import numpy as np
import torch

from ..errors import DataError, first_line

# torchvision.datasets.folder.IMG_EXTENSIONS (compared in lower case, as ImageFolder does), and
# the PIL formats those names stand for: PIL may open nothing else, whatever the file holds
EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
FORMATS = ("BMP", "JPEG", "PNG", "PPM", "TIFF", "WEBP")
# the most pixels an image's header may claim: 64 megapixels (an 8000x8000 photo) decode to 192 MB
# of RGB; PIL itself only warns from 89 megapixels and refuses from 179
MAX_PIXELS = 64_000_000
RESIZE_HINT = "resize it (to 224x224, or 32x32 for the CIFAR networks) or remove it"


def shown(path: str | os.PathLike) -> str:
    """``path`` for a one-line message: as it is when printable, else quoted with escapes (a
    name holding a newline, or bytes that are not UTF-8, which stderr could not even encode)."""
    text = os.fspath(path)
    return text if text.isprintable() else ascii(text)


class ImageError(DataError):
    """A file that is not a usable image: one line naming it.

    Raised in a DataLoader worker process, an exception reaches the main process re-created as
    ``type(e)(text)``, where the text is "Caught ImageError in DataLoader worker process N.",
    then the whole worker traceback. Our own messages are one line, so a multi-line one is such
    a copy: keep only its last line, which is the original message after "module.ImageError: ".
    """

    def __init__(self, message: str) -> None:
        lines = str(message).strip().splitlines()
        if len(lines) > 1:
            prefix = f"{type(self).__module__}.{type(self).__qualname__}: "
            message = lines[-1].removeprefix(prefix)
        super().__init__(message)


# --------------------------------------------------------------------------- listing

def _contains(outer: str, inner: str) -> bool:
    """Whether real path ``outer`` is ``inner`` or a folder above it."""
    return inner == outer or inner.startswith(outer.rstrip(os.sep) + os.sep)


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()  # follows symlinks, as os.walk and ImageFolder do
    except OSError:  # a symlink that loops onto itself: a file to os.walk, so to us
        return False


def _walk(top: str, outside: str) -> list[str]:
    """Image files under folder ``top``, in ImageFolder's order: ``sorted(os.walk(top,
    followlinks=True))``, each folder's files sorted. A folder is entered once, by its smallest
    path, and never when its real path is a folder above the one holding the link, or
    ``outside`` (the split folder) or above it."""
    found: list[str] = []
    visited: set[str] = set()
    # popping paths in sorted order is sorted(os.walk(...))'s order: a folder's path sorts
    # before those of everything under it, so nothing popped later can sort before it
    heap = [(top, os.path.dirname(os.path.realpath(top)))]
    while heap:
        folder, parent = heapq.heappop(heap)
        real = os.path.realpath(folder)
        if real in visited or _contains(real, parent) or _contains(real, outside):
            continue  # a loop or a second way into a folder already listed
        visited.add(real)
        try:
            entries = list(os.scandir(folder))
        except OSError as e:
            raise DataError(f"{shown(folder)}: cannot list this folder ({e.strerror}); fix its "
                            "permissions or remove it") from None
        names = []
        for entry in entries:
            if _is_dir(entry):
                heapq.heappush(heap, (entry.path, real))
            elif entry.name.lower().endswith(EXTENSIONS):
                names.append(entry.name)
        found += [os.path.join(folder, name) for name in sorted(names)]
    return found


def list_images(folder: str | os.PathLike) -> tuple[list[str], list[tuple[str, int]]]:
    """``(classes, samples)`` of ``folder/<class>/...`` as torchvision's ImageFolder lists them
    for an ordinary folder: classes are the sorted names of the sub-folders (symlinks to folders
    included), samples ``(path, class index)`` the files with an image extension under each
    class folder, at any depth, in ``sorted(os.walk())`` order. Symlink loops are not followed
    (see ``_walk``). An empty folder, or a class folder with no image file, is a DataError."""
    folder = os.fspath(folder)
    try:
        with os.scandir(folder) as it:
            classes = sorted(e.name for e in it if _is_dir(e))
    except OSError as e:
        raise DataError(f"{shown(folder)}: cannot list this folder ({e.strerror})") from None
    if not classes:
        raise DataError(f"{shown(folder)}: no class folders in it; expected "
                        f"{os.path.basename(folder)}/<class>/<image>")
    outside = os.path.realpath(folder)
    samples: list[tuple[str, int]] = []
    for label, name in enumerate(classes):
        top = os.path.join(folder, name)
        if _contains(os.path.realpath(top), outside):
            raise DataError(f"{shown(top)}: a link to {shown(folder)} or a folder above it, not a "
                            "class folder; remove the link")
        files = _walk(top, outside)
        if not files:
            raise DataError(f"{shown(top)}: no image files in this class folder (extensions: "
                            f"{', '.join(EXTENSIONS)}); add images or remove the folder")
        samples += [(path, label) for path in files]
    return classes, samples


# --------------------------------------------------------------------------- decoding

def pil_image():
    from PIL import Image  # imported on first use: listing a folder does not need it

    return Image


def bad_file_errors() -> tuple[type[BaseException], ...]:
    """What PIL raises on a damaged or hostile file (never a bug of ours): truncated data
    (OSError), bad fields (ValueError, SyntaxError, struct.error, IndexError), bad compressed
    data (zlib.error), a header claiming too many pixels (DecompressionBombError, and the
    DecompressionBombWarning we turn into an error)."""
    Image = pil_image()
    return (OSError, ValueError, SyntaxError, EOFError, IndexError, struct.error, zlib.error,
            Image.DecompressionBombError, Image.DecompressionBombWarning)


def rgb8(im) -> np.ndarray:
    """A PIL image of any mode -> uint8 (H, W, 3) RGB; decodes the pixel data.

    16 bits per channel become 8 as ``v >> 8``: PIL itself reduces 16-bit RGB, RGBA and
    gray+alpha PNGs and TIFFs to 8 bits by keeping the high byte before we see them, so the same
    rule for 16-bit gray ("I;16", or "I" as PIL reads 16-bit PGMs) decodes a gray image as the
    same image saved in 16-bit RGB. It undoes the usual 8 -> 16 bit widening (v * 257) exactly,
    and never wraps or clips, as PIL's own convert("RGB") of these modes does (it clips at 255).
    Alpha is dropped, as torchvision's ImageFolder loader does (``convert("RGB")``)."""
    mode = im.mode
    if mode == "RGB":
        return np.array(im)  # a writable copy (asarray is read-only, which torch warns about)
    if mode.startswith("I;16") or mode == "I":
        gray = np.asarray(im)  # uint16 (any byte order) or int32
        if mode == "I" and gray.size and (gray.min() < 0 or gray.max() > 65535):
            raise ValueError("32-bit integer pixels outside 0..65535; save it with 8 or 16 bits")
        return np.repeat((gray >> 8).astype(np.uint8)[..., None], 3, axis=2)
    if mode == "F":
        raise ValueError("floating-point pixels; save it with 8 or 16 bits")
    return np.array(im.convert("RGB"))  # L, P, 1, LA, PA, RGBA, CMYK, YCbCr, ...


def _bomb(path, claim: str) -> ImageError:
    return ImageError(f"{shown(path)}: its header claims {claim} pixels, over the limit of "
                      f"{MAX_PIXELS:,} (a decompression bomb?); {RESIZE_HINT}")


def _read(path: str | os.PathLike, decode: bool) -> tuple[tuple[int, int], torch.Tensor | None]:
    Image = pil_image()
    try:
        # O_NONBLOCK: a FIFO named x.png would otherwise block here forever; fstat then refuses it
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise ImageError(f"{shown(path)}: cannot read it ({e.strerror}); fix or remove it") from None
    with open(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ImageError(f"{shown(path)}: not a regular file (a device, a pipe, a socket?); "
                             "remove it from the data folder")
        try:
            with warnings.catch_warnings():
                # PIL only warns for 1-2x its pixel limit: an error here, so one line, no warning
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                with Image.open(f, formats=FORMATS) as im:  # reads the header only
                    width, height = size = im.size
                    if width * height > MAX_PIXELS:
                        raise _bomb(path, f"{width}x{height} = {width * height:,}")
                    pixels = rgb8(im) if decode else None
        except ImageError:
            raise
        except Image.UnidentifiedImageError:
            raise ImageError(f"{shown(path)}: not an image in a format read here "
                             f"({', '.join(FORMATS)}); remove or replace it") from None
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
            found = re.search(r"\((\d+) pixels\)", str(e))
            raise _bomb(path, f"{int(found.group(1)):,}" if found else "too many") from None
        except bad_file_errors() as e:
            raise ImageError(f"{shown(path)}: cannot decode this image ({first_line(e)}); "
                             "remove or replace it") from None
    if pixels is not None and pixels.shape != (height, width, 3):  # a decoder that lied
        raise ImageError(f"{shown(path)}: decoded to {pixels.shape[1]}x{pixels.shape[0]} pixels "
                         f"although its header says {width}x{height}; remove or replace it")
    return size, None if pixels is None else torch.from_numpy(pixels).permute(2, 0, 1)


def check_image(path: str | os.PathLike) -> tuple[int, int]:
    """``(width, height)`` from the header of the image at ``path``; raise ImageError unless it
    is a regular file in one of ``FORMATS`` claiming at most ``MAX_PIXELS`` pixels. Reads the
    header only (tens of microseconds)."""
    return _read(path, decode=False)[0]


def read_image(path: str | os.PathLike) -> torch.Tensor:
    """Decode the image at ``path``, of any size, to uint8 RGB (3, H, W) (a view of a fresh
    array): size checked from the header first (at most ``MAX_PIXELS``); gray, palette and alpha
    images converted, 16-bit ones reduced as ``v >> 8`` (see ``rgb8``). Every problem is one
    ImageError line."""
    return _read(path, decode=True)[1]
