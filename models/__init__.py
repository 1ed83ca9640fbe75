"""Network families for slimming. ``build(arch, cfg=None, **options)`` is the one way to make one.

Each family lives in its own module with a ``Net(cfg=None, ...)`` class that carries:
- ``arch``: its registry name; ``options``: the keyword arguments that rebuild it besides ``cfg``;
- ``cfg``: the widths pruning may change;
- ``prunable_bns()``: the BatchNorm layers whose channels may be cut, and
  ``pruned_cfg(kept)``: the cfg once those layers keep ``kept`` channels each;
- families whose layers are not a chain (``preresnet``, ``densenet``) also declare
  ``channel_slices()``: per BatchNorm2d, the weights its channel mask cuts (see slimming.prune).

Any other network comes from ``external.py``: ``build("torchvision:resnet18", num_classes=10)``,
``build("timm:efficientnet_b0", ...)`` or ``build("package.module:function", ...)``; slimming
prunes those through their traced channel graph.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any

import torch
from torch import nn

from slimming.errors import clip

from . import densenet, external, nin, preresnet, vgg

ARCHS: dict[str, type[nn.Module]] = {net.arch: net for net in (nin.Net, vgg.Net, preresnet.Net,
                                                                  densenet.Net)}


def build(arch: str, cfg: list | dict | None = None, *, empty: bool = False,
          **options: Any) -> nn.Module:
    """Build network ``arch`` with channel widths ``cfg`` (None: the family's default; for an
    external network, the widths it was pruned to, applied from its state_dict).

    ``options`` are the family's own keyword arguments (``depth``, ``num_classes``).
    ``empty=True`` builds on the meta device, skipping weight initialisation: fill it with
    ``load_state_dict(state_dict, assign=True)``. Raises ValueError for an unknown arch or a
    cfg/option the family refuses.
    """
    if external.is_external(arch):
        return external.build_external(arch, cfg, empty=empty, **options)
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {clip(arch)}; choose one of: {', '.join(sorted(ARCHS))}")
    net = ARCHS[arch]
    unknown = set(options) - set(inspect.signature(net).parameters)
    if unknown:
        raise ValueError(f"arch {clip(arch)} takes no option {', '.join(sorted(unknown))}")
    ctx = torch.device("meta") if empty else contextlib.nullcontext()
    with ctx:
        return net(cfg=cfg, **options)


def describe_cfg(cfg: list | dict | None) -> str:
    """A cfg for one line of text: a family's list as it is; a traced network's
    {BatchNorm name: width} as a count (the widths are in the checkpoint)."""
    if isinstance(cfg, dict):
        return f"pruned widths of {len(cfg)} BatchNorm layers"
    return "default widths" if cfg is None else str(cfg)
