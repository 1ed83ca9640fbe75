"""A pruned network of your own class, saved without its code: ``save_pruned(model, path)``
writes its weights (whose shapes are its widths) as a checksummed weights-only file, and
``load_pruned(path, MyNet())`` gives a fresh instance of your class those widths and weights. The
file names no class and imports nothing: the code is yours, the file is only tensors."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from ..errors import CheckpointError, load_error
from ..models.external import resize_like
from ..utils.modules import unwrap
from ..utils.safeload import read_file, save_checked, verify_checksum

FORMAT, VERSION = "slimming-pruned", 1


def save_pruned(model: nn.Module, path: str | os.PathLike, **fields: Any) -> None:
    """Write ``model``'s state_dict (unwrapped from DDP / torch.compile) to ``path``, atomically,
    with a checksum; ``fields``: plain values to keep with it (the epoch, an accuracy)."""
    save_checked({"format": FORMAT, "version": VERSION, **fields,
                  "state_dict": unwrap(model).state_dict()}, path)


def load_pruned(path: str | os.PathLike, model: nn.Module) -> nn.Module:
    """``model`` (a freshly built, unpruned instance of the class that was pruned) given the
    widths and weights saved in ``path``, in place; returned in eval mode. Every Conv2d,
    BatchNorm and Linear takes the width its weights have in the file; anything else must match
    as built. CheckpointError (one line) for a file that is not one, or weights that do not fit."""
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
    model = unwrap(model)
    with torch.no_grad():
        resize_like(model, state, str(path))
        try:
            model.load_state_dict(state, strict=True)
        except (RuntimeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{path}: its weights do not fit {type(model).__name__}: "
                                  f"{load_error(e)}") from None
    return model.eval()
