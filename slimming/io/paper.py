"""Import of checkpoints written by the network-slimming paper's PyTorch code.

Those files are ``{'epoch', 'best_prec1', 'state_dict', 'optimizer'}`` after training (and after
fine-tuning a pruned model: no cfg there) and ``{'cfg', 'state_dict'}`` after pruning. They do
not name their architecture, so the caller says it (``vgg``, ``preresnet`` or the paper's name
``resnet``, ``densenet``); depth, num_classes and cfg are read off the weights.

The paper's pre-activation ResNet and DenseNet normalise every channel of the stream and then
select (``bn1 -> select``, ``select.indexes`` a float 0/1 vector over the BN's channels); ours
selects first (``select -> bn1``, an int64 ``select.index``, a BN holding only the kept
channels). Per channel the same arithmetic, so converting a file slices the paper's full-width
BN to its kept channels and turns the mask into the positions it marks (nonzero entries, as
the paper's ``np.argwhere`` reads it).
"""

from __future__ import annotations

import math
import os

import torch

from .. import models
from ..errors import CheckpointError, clip, first_line
from .structure import read_structure, readable


def _number(value) -> float | None:
    """A finite number from an int, float or 0-d tensor field; None for anything else (the
    paper's code writes no type checks, and a hand-edited file may hold anything)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.dtype.is_complex:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _accuracy(best_prec1) -> float | None:
    """The paper stores the best accuracy as a fraction (sometimes a 0-d tensor); ours is in %."""
    value = _number(best_prec1)
    if value is None or not 0 <= value <= 100:
        return None
    return 100.0 * value if value <= 1.0 else value


def _saved_cfg(cfg, path) -> list:
    if not isinstance(cfg, (list, tuple)) or not all(
            v == "M" or (isinstance(v, int) and not isinstance(v, bool)) for v in cfg):
        raise CheckpointError(f"{path}: its 'cfg' is {type(cfg).__name__} {clip(cfg, 60)}, not a "
                              "list of widths and 'M'")
    return list(cfg)


def from_paper(ckpt: dict, arch: str, depth: int | None = None,
               path: str | os.PathLike = "checkpoint") -> dict:
    """The fields of the slimming checkpoint equivalent to the paper's file ``ckpt`` (already
    loaded, its ``module.`` prefix stripped): arch, options, cfg, state_dict, origin and, when
    the file has them, epoch and best_acc. Raises CheckpointError (one line) when the weights do
    not fit ``arch`` (and ``depth``, when given) or the file's own cfg."""
    arch = models.canonical(arch)  # the paper's names (``resnet``) are the families' aliases
    if arch not in readable():
        raise CheckpointError(f"{path}: unknown arch {clip(arch)}; choose one of: "
                              f"{', '.join(sorted(readable()))}")
    sd = dict(ckpt["state_dict"])
    for key in [k for k in sd if k.endswith(".running_mean")]:  # files from PyTorch < 0.4.1
        sd.setdefault(key[:-len("running_mean")] + "num_batches_tracked", torch.tensor(0))
    try:
        options, cfg = read_structure(arch, sd, depth)
    except (KeyError, IndexError, ValueError, AttributeError, TypeError) as e:
        detail = f"no {e.args[0]!r}" if isinstance(e, KeyError) else first_line(e)
        raise CheckpointError(f"{path}: not a checkpoint of the paper's {arch}: {detail}") from None
    if ckpt.get("cfg") is not None:
        saved = _saved_cfg(ckpt["cfg"], path)
        if saved != cfg:
            raise CheckpointError(f"{path}: its cfg {clip(saved)} does not match its weights "
                                  f"({clip(cfg)})")
    try:
        default = models.build(arch, empty=True, **options).cfg
    except ValueError as e:
        raise CheckpointError(f"{path}: cannot rebuild its network: {first_line(e)}") from None
    out = {"arch": arch, "options": options, "cfg": None if cfg == default else cfg,
           "state_dict": sd, "origin": "network-slimming paper code"}
    epoch = _number(ckpt.get("epoch"))
    if epoch is not None and epoch >= 0 and epoch == int(epoch):
        out["epoch"] = int(epoch)
    accuracy = _accuracy(ckpt.get("best_prec1"))
    if accuracy is not None:
        out["best_acc"] = accuracy
    return out
