"""A pruned network of your own class, saved without its code: ``save_pruned(model, path)``
writes its weights (whose shapes are its widths) as a checksummed weights-only file, and
``load_pruned(path, MyNet())`` gives a fresh instance of your class those widths and weights. The
file names no class and imports nothing: the code is yours, the file is only tensors."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import CheckpointError, SlimmingError, clip, load_error
from ..models.external import resize_like
from ..utils.modules import unwrap
from ..utils.safeload import read_file, save_checked, verify_checksum

FORMAT, VERSION = "slimming-pruned", 1


def save_pruned(model: nn.Module, path: str | os.PathLike, **fields: Any) -> None:
    """Write ``model``'s state_dict (unwrapped from DDP / torch.compile) to ``path``, atomically,
    with a checksum, and its modules' integer attributes (the widths the cut set: a C2f block's
    ``c``, a GroupNorm's ``num_groups``); ``fields``: plain values to keep with it (the epoch,
    an accuracy)."""
    model, path = _module(model), _path(path)
    if path.is_dir():
        raise SlimmingError(f"{path} is a folder: save_pruned writes a file (give its name)", param="path")
    if any(p.exists() and not p.is_dir() for p in path.parents):
        raise SlimmingError(f"{path}: a file stands where its folder would be", param="path")
    save_checked({"format": FORMAT, "version": VERSION, **fields, "widths": int_attributes(model),
                  "state_dict": model.state_dict()}, path)


def _path(path) -> Path:
    if not isinstance(path, (str, os.PathLike)) or isinstance(path, bytes) or not str(path):
        raise SlimmingError(f"path must be a file name (str or Path), not {clip(repr(path))}", param="path")
    return Path(path)


def _module(model) -> nn.Module:
    if not isinstance(model, nn.Module):
        raise SlimmingError(f"model must be an nn.Module (a fresh instance of the pruned class), not "
                            f"{type(model).__name__}", param="model")
    return unwrap(model)


def int_attributes(model: nn.Module) -> dict[str, int]:
    """{"module.attribute": value} for every public integer attribute of ``model``'s modules."""
    return {f"{name}.{attr}" if name else attr: v for name, m in model.named_modules()
            for attr, v in vars(m).items() if type(v) is int and not attr.startswith("_")}


def _set_widths(model: nn.Module, widths, path) -> None:
    """The saved integer attributes, set where the fresh model has that attribute as an int of
    at least that value (a cut only lowers widths; a file cannot raise one)."""
    if widths is None:
        return  # a file from before they were saved
    if not isinstance(widths, dict) or not all(isinstance(k, str) and type(v) is int
                                               for k, v in widths.items()):
        raise CheckpointError(f"{path}: its widths are not integer attributes by name")
    modules = dict(model.named_modules())
    for key, value in widths.items():
        name, _, attr = key.rpartition(".")
        m = modules.get(name)
        if m is not None and type(vars(m).get(attr)) is int and 0 <= value <= vars(m)[attr]:
            setattr(m, attr, value)


def load_pruned(path: str | os.PathLike, model: nn.Module) -> nn.Module:
    """``model`` (a freshly built, unpruned instance of the class that was pruned) given the
    widths and weights saved in ``path``, in place; returned in eval mode. Every layer takes the
    width its weights have in the file, every integer attribute the value saved; anything else
    must match as built. CheckpointError (one line) for a file that is not one, or weights that do not fit."""
    path, model = _path(path), _module(model)
    blob = read_file(path)  # bounded, weights_only
    if not isinstance(blob, dict) or blob.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a file written by slimming.save_pruned")
    if blob.get("version") != VERSION:
        raise CheckpointError(f"{path}: a save_pruned file of version {blob.get('version')!r}, not {VERSION}")
    verify_checksum(blob, path)
    state = blob.get("state_dict")
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        raise CheckpointError(f"{path}: its state_dict holds something other than named tensors")
    with torch.no_grad():
        resize_like(model, state, str(path))
        _set_widths(model, blob.get("widths"), path)
        try:
            model.load_state_dict(state, strict=True)
        except (RuntimeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{path}: its weights do not fit {type(model).__name__}: "
                                  f"{load_error(e)}") from None
    return model.eval()
