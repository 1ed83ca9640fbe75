"""Reading a file that may be hostile: what ``torch.load`` is allowed to cost.

``weights_only=True`` stops a file from running code; this module also stops it from costing
memory or time out of proportion to its size. Before and after ``torch.load``:

- the zip records must be stored, not compressed (``torch.save`` never compresses; a deflated
  record is a zip bomb: 1 MB on disk, 1 GB in memory) and may not claim more bytes than the file;
- everything is loaded onto the CPU first (a device comes after the checks);
- the loaded object is walked without recursion, with a budget: at most ``2 * file size`` nodes
  (a pickle can reference one list from many places, so a tiny file can describe an exponential
  tree: "billion laughs") and a nesting depth of ``MAX_DEPTH``; only dicts, lists, tuples, str,
  bytes, bool, 64-bit int, float, None and dense tensors are accepted;
- a tensor must own the bytes it claims: its elements fit in its storage (an expanded, zero-
  stride tensor "of" 10 GB over 4 bytes of storage is refused before anything copies it).

``checksum`` is the BLAKE2b digest slimming writes into its files, over the walk's order;
``save_checked`` writes a dict with it, atomically: checkpoints and the data caches alike.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import re
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError, clip, first_line
from .files import atomic_path

MAX_DEPTH = 32
PLAIN = (str, bytes, bool, float, type(None))
DTYPES = {torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.uint8, torch.int8,
          torch.int16, torch.int32, torch.int64, torch.bool}


def _check_zip(path: Path, size: int) -> None:
    if not zipfile.is_zipfile(path):
        return  # the legacy (pre-1.6) format: read by torch.load, which checks record sizes
    try:
        with zipfile.ZipFile(path) as z:
            infos = z.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return  # torch.load reports a damaged archive in its own words
    if any(i.compress_type != zipfile.ZIP_STORED for i in infos):
        raise CheckpointError(f"{path}: refused: it holds compressed records, which torch.save "
                              "never writes (a compressed record can expand to gigabytes)")
    if sum(i.file_size for i in infos) > size:
        raise CheckpointError(f"{path}: refused: its records claim more bytes than the file has")


def check_tensor(t: torch.Tensor, where: str) -> None:
    """A dense tensor of a known dtype whose elements lie inside its own storage."""
    if t.layout != torch.strided or t.is_quantized or t.dtype not in DTYPES:
        raise ValueError(f"{where}: a {t.layout} {t.dtype} tensor; only dense float/int/bool "
                         "tensors are accepted")
    if t.numel() == 0:
        return
    extent = t.storage_offset() + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    nbytes = t.untyped_storage().nbytes()
    if (min(t.stride(), default=1) < 0 or (extent + 1) * t.element_size() > nbytes
            or t.numel() * t.element_size() > nbytes):
        raise ValueError(f"{where}: a tensor of {tuple(t.shape)} over {nbytes} bytes of storage "
                         "(expanded or overlapping): refused")


def walk(obj: Any, budget: int) -> None:
    """Check ``obj``'s structure (types, depth, size, tensors) within ``budget`` nodes; raises
    ValueError with one line saying what is wrong."""
    stack: list[tuple[Any, int, str]] = [(obj, 0, "")]
    seen = 0
    while stack:
        node, depth, path = stack.pop()
        where = path.lstrip("/")[:80] or "the top"
        seen += 1
        if seen > budget:
            raise ValueError("more objects than a file of this size can hold without shared "
                             "references (an exponential structure?)")
        if depth > MAX_DEPTH:
            raise ValueError(f"nested deeper than {MAX_DEPTH} levels at {where}")
        if isinstance(node, torch.Tensor):
            check_tensor(node, where)
        elif isinstance(node, dict):
            for k, v in node.items():
                if not isinstance(k, (str, int)) or isinstance(k, bool):
                    raise ValueError(f"a key of type {type(k).__name__} at {where}")
                stack.append((k, depth + 1, path))
                stack.append((v, depth + 1, f"{path}/{clip(k, 60)}"))
        elif isinstance(node, (list, tuple)):
            stack.extend((v, depth + 1, f"{path}[{i}]") for i, v in enumerate(node))
        elif isinstance(node, int) and not isinstance(node, bool):
            if node.bit_length() > 64:
                raise ValueError(f"an integer of {node.bit_length()} bits at {where}")
        elif not isinstance(node, PLAIN) and not isinstance(node, torch.dtype):
            raise ValueError(f"a {type(node).__name__} at {where}")


def read_file(path: str | os.PathLike) -> Any:
    """``torch.load(path, weights_only=True)`` onto the CPU, bounded as described above.
    Every problem is one CheckpointError line naming ``path``."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such file")
    if path.is_dir():
        raise CheckpointError(f"{path}: is a directory, expected a checkpoint file")
    if not path.is_file():
        raise CheckpointError(f"{path}: not a regular file")
    size = path.stat().st_size
    _check_zip(path, size)
    try:
        with warnings.catch_warnings():  # e.g. about validating sparse tensors: refused below
            warnings.simplefilter("ignore")
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        found = re.search(r"(?:Unsupported global: GLOBAL|unsupported GLOBAL) ([\w.]+)", str(e))
        if found:  # a class or function whose unpickling would run code: never run it
            raise CheckpointError(
                f"{path}: refused: it holds a Python object ({found.group(1)}) that loading "
                "would have to execute; only tensors and plain values are accepted") from None
        if _plain_pickle(path):
            raise CheckpointError(f"{path}: refused: a plain Python pickle (pickle.dump, protocol 3 "
                                  "or later), which the safe loader does not read; save it with "
                                  "torch.save, holding only tensors and plain values") from None
        found = re.search(r"WeightsUnpickler error:\s*(.+)", str(e))  # torch's real reason
        detail = f" ({clip(found.group(1).strip(), 120)})" if found else ""
        raise CheckpointError(f"{path}: not a readable PyTorch checkpoint, corrupt or "
                              f"truncated?{detail}") from None
    except PermissionError:
        raise CheckpointError(f"{path}: permission denied") from None
    except MemoryError:
        raise CheckpointError(f"{path}: refused: loading it needs more memory than its size "
                              "warrants") from None
    except Exception as e:  # truncated zip, random bytes, ...: all mean the same to the user
        raise CheckpointError(f"{path}: not a readable PyTorch checkpoint, corrupt or truncated? "
                              f"({first_line(e)})") from None
    try:
        walk(obj, budget=2 * size + 1000)
    except ValueError as e:
        raise CheckpointError(f"{path}: refused: {e}") from None
    return obj


def _plain_pickle(path: Path) -> bool:
    """Whether ``path`` starts as pickle.dump writes (protocol 3 to 5), not as torch.save does
    (a zip archive, or the legacy format's protocol-2 magic number)."""
    with open(path, "rb") as f:
        head = f.read(2)
    return len(head) == 2 and head[0] == 0x80 and 3 <= head[1] <= 5


def _feed(h, obj: Any) -> None:
    """Hash ``obj`` (already ``walk``ed: bounded) in a fixed traversal order."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy())
    elif isinstance(obj, dict):
        h.update(f"D{len(obj)}".encode())
        for k, v in obj.items():
            _feed(h, k)
            _feed(h, v)
    elif isinstance(obj, (list, tuple)):
        h.update(f"L{len(obj)}".encode())
        for v in obj:
            _feed(h, v)
    else:
        h.update(f"V{type(obj).__name__}{obj!r}".encode())


def checksum(obj: dict[str, Any]) -> str:
    """A BLAKE2b digest of every tensor byte and plain value of ``obj`` but its "checksum"."""
    h = hashlib.blake2b(digest_size=16)
    _feed(h, {k: v for k, v in obj.items() if k != "checksum"})
    return h.hexdigest()


def verify_checksum(obj: dict[str, Any], path: str | os.PathLike) -> None:
    """Raise CheckpointError when ``obj`` carries a checksum that its contents do not match."""
    if "checksum" in obj and obj["checksum"] != checksum(obj):
        raise CheckpointError(f"{path}: corrupt: its contents do not match the checksum written "
                              "with it (a damaged copy? use another checkpoint, e.g. best.pth)")


def to_cpu(obj: Any) -> Any:
    """``obj`` with every tensor in it detached and on the CPU."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


def save_checked(obj: dict[str, Any], path: str | os.PathLike) -> None:
    """Write ``obj`` plus its ``checksum`` to ``path`` atomically (``slimming.utils.files``): a
    crash or a signal leaves the old file or the new one, never half of one; flipped bits are
    caught by the checksum on load. Tensors are saved from the CPU, so a file is the same
    whatever device it was made on, and loads on a machine without that device."""
    obj = to_cpu(obj)
    obj["checksum"] = checksum(obj)
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        torch.save(obj, f)  # a file object: the archive's inner name does not vary with tmp
