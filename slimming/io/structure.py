"""What a state_dict says about its network: depth, number of classes and cfg read off the
weight shapes by each family's ``read_structure`` (in its own file), and checking what a
checkpoint declares against them before anything is built from the declaration (a file that
claims a depth-10^9 ResNet over a few tensors must cost nothing).

The readers accept both layouts of the pre-activation ResNet and DenseNet entries: this
toolkit's (``select.index``, a BN of the kept channels) and the paper's (``select.indexes``, a
full-width BN), converting the latter in place (``models.common.paper_entry``; see
``slimming.io.paper``).
"""

from __future__ import annotations

import inspect

from .. import models
from ..models.vgg import DEFAULT_CFGS


def readable() -> dict[str, type]:
    """The families that can read the paper's files, by name."""
    return {name: net for name, net in models.FAMILIES.items() if getattr(net, "read_structure", None)}


def default_option(arch: str, name: str):
    return inspect.signature(models.family(arch)).parameters[name].default


def read_structure(arch: str, state_dict: dict, depth: int | None = None) -> tuple[dict, list]:
    """(options, cfg) of a network of family ``arch`` as its weights say; converts the paper's
    entry layout in ``state_dict`` in place. Raises KeyError/ValueError/... on a misfit."""
    return models.family(arch).read_structure(state_dict, depth)


def check_declared(arch: str, options: dict, cfg: list | None, state_dict: dict) -> None:
    """Raise ValueError unless ``options`` and ``cfg`` (None: the family's default) describe the
    network ``state_dict``'s shapes describe. Reads shapes only; builds nothing. A family
    without a ``read_structure`` is checked by its strict load alone."""
    if getattr(models.family(arch), "read_structure", None) is None:
        return
    have, widths = models.family(arch).read_structure(dict(state_dict), None)
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
