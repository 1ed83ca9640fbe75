"""Checkpoints: plain dicts of tensors and Python values, written atomically, read safely.

Format (``version`` 1)::

    {"format": "slimming", "version": 1,
     "arch": "vgg", "options": {"depth": 19, "num_classes": 10},
     "cfg": None | [widths...],          # None: the family's default widths
     "cfg_mask": None | [bool tensor per BatchNorm2d of the network it was pruned from],
     "state_dict": {...}, "epoch": completed epochs, "acc": test accuracy (%), "best_acc": ...,
     "optimizer": ..., "scheduler": ..., "args": {...the run's arguments...}, ...}

Files of the paper's own PyTorch code (no "arch") load too, given their arch: slimming.compat.
Everything loads with ``torch.load(path, weights_only=True)``: nothing in a file is executed.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import re
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

import models

FORMAT, VERSION = "slimming", 1


class CheckpointError(ValueError):
    """A file that is not a usable checkpoint; the message is one line meant for the user."""


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:200] if text else type(e).__name__


def default_file_mode() -> int:
    """0o666 less the umask: what ``open()`` would give a new file (mkstemp gives 0o600)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def _feed(h, obj: Any) -> None:
    """Hash ``obj`` (tensors, dicts, lists, tuples, plain values) in a fixed traversal order."""
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


def checksum(ckpt: dict[str, Any]) -> str:
    """A BLAKE2b digest of every tensor byte and plain value of ``ckpt`` but its "checksum"."""
    h = hashlib.blake2b(digest_size=16)
    _feed(h, {k: v for k, v in ckpt.items() if k != "checksum"})
    return h.hexdigest()


def save_checkpoint(ckpt: dict[str, Any], path: str | os.PathLike) -> None:
    """Write ``ckpt`` plus its ``checksum`` to ``path`` atomically: a temporary file in the same
    folder, flushed and fsynced, then renamed over ``path``. A crash leaves the old file or the
    new one, never half of one; flipped bits are caught by the checksum on load."""
    ckpt = {**ckpt, "checksum": checksum(ckpt)}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), default_file_mode())
            torch.save(ckpt, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu",
                    arch: str | None = None, depth: int | None = None) -> dict:
    """Read a checkpoint with ``weights_only=True``; any problem is one CheckpointError line.

    A file that does not name its architecture (one written by the paper's PyTorch code) needs
    ``arch`` (``vgg``, ``preresnet``/``resnet``, ``densenet``) and is converted to a slimming
    checkpoint (see ``slimming.compat``); ``depth`` is then read off its weights unless given.
    For a slimming file, ``arch`` and ``depth`` when given must agree with it.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such file")
    if path.is_dir():
        raise CheckpointError(f"{path}: is a directory, expected a checkpoint file")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(e))
        if found:  # a class or function whose unpickling would run code: never run it
            raise CheckpointError(
                f"{path}: refused: it holds a Python object ({found.group(1)}) that loading "
                "would have to execute; only tensors and plain values are accepted") from None
        raise CheckpointError(f"{path}: not a readable PyTorch checkpoint, corrupt or "
                              "truncated?") from None
    except PermissionError:
        raise CheckpointError(f"{path}: permission denied") from None
    except Exception as e:  # truncated zip, random bytes, ...: all mean the same to the user
        raise CheckpointError(f"{path}: not a readable PyTorch checkpoint, corrupt or truncated? "
                              f"({_first_line(e)})") from None
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("state_dict"), dict):
        raise CheckpointError(f"{path}: not a checkpoint: it has no 'state_dict'")
    if "checksum" in ckpt and ckpt["checksum"] != checksum(ckpt):
        raise CheckpointError(f"{path}: corrupt: its contents do not match the checksum written "
                              "with it (a damaged copy? use another checkpoint, e.g. best.pth)")
    ckpt["state_dict"] = strip_prefix(ckpt["state_dict"])
    if "arch" not in ckpt:
        if arch is None:
            raise CheckpointError(f"{path}: the file does not say its architecture ('arch'): it was "
                                  "not written by slimming; pass --arch (vgg, preresnet, densenet)")
        from .compat import from_paper

        return from_paper(ckpt, arch, depth, path)
    from .compat import PAPER_NAMES

    if arch is not None and PAPER_NAMES.get(arch, arch) != ckpt["arch"]:
        raise CheckpointError(f"{path}: the file holds arch {ckpt['arch']!r}, not {arch!r}")
    have = (ckpt.get("options") or {}).get("depth")
    if depth is not None and have is not None and depth != have:
        raise CheckpointError(f"{path}: the file holds a depth-{have} {ckpt['arch']}, not depth {depth}")
    return ckpt


def strip_prefix(state_dict: dict, prefix: str = "module.") -> dict:
    """Drop the ``module.`` prefix that DataParallel/DDP put on every key."""
    if state_dict and all(isinstance(k, str) and k.startswith(prefix) for k in state_dict):
        return {k[len(prefix):]: v for k, v in state_dict.items()}
    return state_dict


def model_from_checkpoint(ckpt: dict, path: str | os.PathLike = "checkpoint") -> nn.Module:
    """Rebuild the network a loaded checkpoint describes, weights in place (their device)."""
    arch, cfg, options = ckpt["arch"], ckpt.get("cfg"), ckpt.get("options") or {}
    try:
        model = models.build(arch, cfg=cfg, empty=True, **options)
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{path}: cannot rebuild its network: {_first_line(e)}") from None
    try:
        model.load_state_dict(ckpt["state_dict"], assign=True)
    except (RuntimeError, KeyError, TypeError, AttributeError) as e:
        detail = _first_line(e) if "Error(s) in loading" not in str(e) else str(e).splitlines()[1]
        raise CheckpointError(f"{path}: its weights do not fit arch {arch!r} with cfg {cfg}: "
                              f"{detail.strip()}") from None
    return model


def load_model(path: str | os.PathLike, device: str | torch.device = "cpu", arch: str | None = None,
               depth: int | None = None) -> nn.Module:
    """Rebuild any slimming checkpoint (pruned or not), or one of the paper's code given its
    ``arch``, as a ready-to-use ``nn.Module`` in eval mode on ``device``. Raises CheckpointError
    with a one-line reason for unusable files."""
    ckpt = load_checkpoint(path, map_location=device, arch=arch, depth=depth)
    return model_from_checkpoint(ckpt, path).eval()


def checkpoint_dict(model: nn.Module, **fields: Any) -> dict[str, Any]:
    """The checkpoint of ``model``: how to rebuild it plus ``fields`` (epoch, acc, ...)."""
    from .prune import unwrap

    model = unwrap(model)
    default = models.build(model.arch, empty=True, **model.options).cfg
    return {"format": FORMAT, "version": VERSION, "arch": model.arch,
            "options": dict(model.options), "cfg": None if model.cfg == default else model.cfg,
            "state_dict": model.state_dict(), **fields}
