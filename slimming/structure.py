"""What a state_dict says about its network: reading depth, number of classes and cfg off the
weight shapes of each family, and checking what a checkpoint declares against them before
anything is built from the declaration (a file that claims a depth-10^9 ResNet over a few
tensors must cost nothing).

The readers accept both layouts of the pre-activation ResNet and DenseNet entries: this
toolkit's (``select.index``, a BN of the kept channels) and the paper's (``select.indexes``, a
full-width BN), converting the latter in place (``_entry``; see ``slimming.compat``).
"""

from __future__ import annotations

import inspect
import re

import torch

from . import models
from .models.common import BN_STATE
from .models.vgg import DEFAULT_CFGS


def _conv_widths(sd: dict, prefix: str) -> list[tuple[int, torch.Tensor]]:
    """(N, weight) of every 4-d ``{prefix}.N.weight``, by N."""
    found = [(int(m.group(1)), v) for k, v in sd.items()
             if (m := re.fullmatch(rf"{re.escape(prefix)}\.(\d+)\.weight", k)) and v.dim() == 4]
    if not found:
        raise ValueError(f"no {prefix}.N conv weights")
    return sorted(found, key=lambda t: t[0])


def _vgg(sd: dict, depth: int | None) -> tuple[dict, list]:
    cfg, i = [], 0
    for j, w in _conv_widths(sd, "feature"):  # conv j, BN j+1, ReLU j+2, a max-pool in a gap
        if j - i not in (0, 1):
            raise ValueError(f"feature.{j} is not where a VGG conv can be")
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


def default_option(arch: str, name: str):
    return inspect.signature(models.ARCHS[arch]).parameters[name].default


def read_structure(arch: str, state_dict: dict, depth: int | None = None) -> tuple[dict, list]:
    """(options, cfg) of a network of family ``arch`` as its weights say; converts the paper's
    entry layout in ``state_dict`` in place. Raises KeyError/ValueError/... on a misfit."""
    return READERS[arch](state_dict, depth)


def check_declared(arch: str, options: dict, cfg: list | None, state_dict: dict) -> None:
    """Raise ValueError unless ``options`` and ``cfg`` (None: the family's default) describe the
    network ``state_dict``'s shapes describe. Reads shapes only; builds nothing."""
    have, widths = READERS[arch](dict(state_dict), None)
    classes = options.get("num_classes", default_option(arch, "num_classes"))
    if classes != have["num_classes"]:
        raise ValueError(f"it declares {classes} classes but its weights have {have['num_classes']}")
    if "depth" in have and arch != "vgg":
        depth = options.get("depth", default_option(arch, "depth"))
        if depth != have["depth"]:
            raise ValueError(f"it declares depth {depth} but its weights are depth {have['depth']}")
    if cfg is None:
        if arch == "vgg":
            depth = options.get("depth", default_option(arch, "depth"))
            if depth not in DEFAULT_CFGS:
                raise ValueError(f"it declares VGG depth {depth!r}; VGG depths are {sorted(DEFAULT_CFGS)}")
            cfg = DEFAULT_CFGS[depth]
        else:
            cfg = models.build(arch, empty=True, **{**options, "num_classes": 1}).cfg  # depth checked
    if list(cfg) != widths:
        raise ValueError(f"it declares cfg {str(cfg)[:120]} but its weights have {str(widths)[:120]}")
