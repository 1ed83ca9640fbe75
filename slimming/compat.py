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

import os
import re

import torch

import models
from models.common import BN_STATE
from models.vgg import DEFAULT_CFGS

from .checkpoint import FORMAT, VERSION, CheckpointError, _first_line, model_from_checkpoint

PAPER_NAMES = {"resnet": "preresnet"}  # the paper's --arch names that differ from ours


def _conv_widths(sd: dict, prefix: str) -> list[tuple[int, torch.Tensor]]:
    """(N, weight) of every 4-d ``{prefix}.N.weight``, by N."""
    found = [(int(m.group(1)), v) for k, v in sd.items()
             if (m := re.fullmatch(rf"{re.escape(prefix)}\.(\d+)\.weight", k)) and v.dim() == 4]
    if not found:
        raise ValueError(f"no {prefix}.N conv weights")
    return sorted(found, key=lambda t: t[0])


def _vgg(sd: dict, depth: int | None) -> tuple[dict, list]:
    cfg, i = [], 0
    for j, w in _conv_widths(sd, "feature"):  # conv j, BN j+1, ReLU j+2, max-pools in the gaps
        cfg += ["M"] * (j - i) + [w.shape[0]]
        i = j + 3
    shape = ["M" if v == "M" else 0 for v in cfg]
    same = [d for d, c in DEFAULT_CFGS.items() if ["M" if v == "M" else 0 for v in c] == shape]
    if depth is None:
        depth = same[0] if same else 19  # a custom cfg: build() keeps depth 19 as its option
    elif depth not in same:
        raise ValueError(f"its {sum(v != 'M' for v in cfg)} convs and max-pools are not VGG-{depth}'s")
    return {"depth": depth, "num_classes": sd["classifier.weight"].shape[0]}, cfg


def _nin(sd: dict, depth: int | None) -> tuple[dict, list]:
    convs = _conv_widths(sd, "feature")
    if depth is not None:
        raise ValueError("NIN takes no depth")
    return {"num_classes": convs[-1][1].shape[0]}, [w.shape[0] for _, w in convs[:-1]]


def _count(sd: dict, prefix: str) -> int:
    return len({m.group(1) for k in sd if (m := re.match(rf"{prefix}\.(\d+)\.", k))})


def _entry(sd: dict, bn: str, select: str) -> None:
    """The paper's full-width ``bn`` + float ``select.indexes`` -> our kept-channel ``bn`` and
    int64 ``select.index``, in place. A file already in our layout passes through."""
    indexes = sd.pop(f"{select}.indexes", None)
    if indexes is None:
        if f"{select}.index" not in sd:  # no selection at all: every channel is read
            sd[f"{select}.index"] = torch.arange(sd[f"{bn}.weight"].numel(), device=sd[f"{bn}.weight"].device)
        return
    width = sd[f"{bn}.weight"].numel()
    if indexes.dim() != 1 or indexes.numel() != width:
        raise ValueError(f"{select}.indexes has {indexes.numel()} entries for the {width} channels of {bn}")
    keep = indexes.nonzero().squeeze(1)
    for key in BN_STATE:
        sd[f"{bn}.{key}"] = sd[f"{bn}.{key}"].index_select(0, keep)
    sd[f"{select}.index"] = keep


def _preresnet(sd: dict, depth: int | None) -> tuple[dict, list]:
    n = _count(sd, "layer1")
    if n == 0 or _count(sd, "layer2") != n or _count(sd, "layer3") != n:
        raise ValueError("layer1..3 do not hold the same number of blocks")
    if depth is not None and depth != 9 * n + 2:
        raise ValueError(f"it has {n} blocks a stage: depth {9 * n + 2}, not {depth}")
    cfg = []
    for s in range(1, 4):
        for k in range(n):
            p = f"layer{s}.{k}."
            _entry(sd, p + "bn1", p + "select")
            w1, w2 = sd[p + "conv1.weight"], sd[p + "conv2.weight"]
            cfg += [w1.shape[1], w1.shape[0], w2.shape[0]]
    _entry(sd, "bn", "select")
    return {"depth": 9 * n + 2, "num_classes": sd["fc.weight"].shape[0]}, cfg + [sd["fc.weight"].shape[1]]


def _densenet(sd: dict, depth: int | None) -> tuple[dict, list]:
    n = _count(sd, "dense1")
    if n == 0 or _count(sd, "dense2") != n or _count(sd, "dense3") != n:
        raise ValueError("dense1..3 do not hold the same number of layers")
    if depth is not None and depth != 3 * n + 4:
        raise ValueError(f"it has {n} layers a dense block: depth {3 * n + 4}, not {depth}")
    cfg = []
    for b in range(1, 4):
        for p in [f"dense{b}.{i}" for i in range(n)] + ([f"trans{b}"] if b < 3 else []):
            _entry(sd, p + ".bn1", p + ".select")
            w = sd[p + ".conv1.weight"]
            if p.startswith("dense") and w.shape[0] != models.densenet.GROWTH:
                raise ValueError(f"growth rate {w.shape[0]}; only {models.densenet.GROWTH} is supported")
            cfg.append(w.shape[1])
    _entry(sd, "bn", "select")
    return {"depth": 3 * n + 4, "num_classes": sd["fc.weight"].shape[0]}, cfg + [sd["fc.weight"].shape[1]]


READERS = {"vgg": _vgg, "nin": _nin, "preresnet": _preresnet, "densenet": _densenet}


def _accuracy(best_prec1) -> float:
    """The paper stores the best accuracy as a fraction (sometimes a 0-d tensor); ours is in %."""
    value = float(best_prec1)
    return 100.0 * value if value <= 1.0 else value


def from_paper(ckpt: dict, arch: str, depth: int | None = None,
               path: str | os.PathLike = "checkpoint") -> dict:
    """The slimming checkpoint equivalent to the paper's file ``ckpt`` (already loaded, its
    ``module.`` prefix stripped). Raises CheckpointError (one line) when the weights do not fit
    ``arch`` (and ``depth``, when given) or the file's own cfg."""
    arch = PAPER_NAMES.get(arch, arch)
    if arch not in READERS:
        raise CheckpointError(f"{path}: unknown arch {arch!r}; choose one of: {', '.join(sorted(READERS))}")
    sd = dict(ckpt["state_dict"])
    for key in [k for k in sd if k.endswith(".running_mean")]:  # files from PyTorch < 0.4.1
        sd.setdefault(key[:-len("running_mean")] + "num_batches_tracked", torch.tensor(0))
    try:
        options, cfg = READERS[arch](sd, depth)
    except (KeyError, IndexError, ValueError, AttributeError, TypeError) as e:
        detail = f"no {e.args[0]!r}" if isinstance(e, KeyError) else _first_line(e)
        raise CheckpointError(f"{path}: not a checkpoint of the paper's {arch}: {detail}") from None
    if ckpt.get("cfg") is not None:
        saved = [v if v == "M" else int(v) for v in ckpt["cfg"]]
        if saved != cfg:
            raise CheckpointError(f"{path}: its cfg {saved} does not match its weights ({cfg})")
    try:
        default = models.build(arch, empty=True, **options).cfg
    except ValueError as e:
        raise CheckpointError(f"{path}: cannot rebuild its network: {_first_line(e)}") from None
    out = {"format": FORMAT, "version": VERSION, "arch": arch, "options": options,
           "cfg": None if cfg == default else cfg, "state_dict": sd,
           "origin": "network-slimming paper code"}
    if "epoch" in ckpt:
        out["epoch"] = int(ckpt["epoch"])
    if ckpt.get("best_prec1") is not None:
        out["best_acc"] = _accuracy(ckpt["best_prec1"])
    model_from_checkpoint(out, path)  # on the meta-built network: any misfit is a CheckpointError now
    return out
