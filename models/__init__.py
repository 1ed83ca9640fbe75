"""Network families for slimming. ``build(arch, cfg=None, **options)`` is the one way to make one.

Each family is one module with a ``Net(cfg=None, ...)`` class registered with ``@register``
(``registry.py`` states the contract: name and aliases, input size, how pruning copies its
weights, its reader for the paper's files); ``options`` are the keyword arguments that rebuild
it besides ``cfg``. Families whose layers are not a chain (``preresnet``, ``densenet``) declare
``channel_slices()``: per BatchNorm2d, the weights its channel mask cuts (see
``slimming.pruning.prune``). A shipped family is one file, imported below; one of your own is
one file of yours, registered when it is imported.

Any other network comes from ``external.py``: ``build("torchvision:resnet18", num_classes=10)``,
``build("timm:efficientnet_b0", ...)`` or ``build("package.module:function", ...)``; slimming
prunes those through their traced channel graph.

Which parts it may import: ``docs/layout.md``. ``check_input_size`` builds on the meta device.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any

import torch
from torch import nn

from ..errors import SlimmingError, clip, first_line
from . import densenet, external, nin, preresnet, vgg  # noqa: F401 (each registers its family)
from .registry import ALIASES, FAMILIES, canonical, family, register

ARCHS = FAMILIES  # the registered families by name (the name before 0.2)
__all__ = ["ALIASES", "ARCHS", "FAMILIES", "build", "canonical", "check_input_size", "describe_cfg", "family",
           "register"]


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
    net = FAMILIES.get(arch)  # a family's own name (the CLI and the paper's files map aliases)
    if net is None:
        raise ValueError(f"unknown arch {clip(arch)}; choose one of: {', '.join(sorted(FAMILIES))}")
    unknown = set(options) - set(inspect.signature(net).parameters)
    if unknown:
        raise ValueError(f"arch {clip(arch)} takes no option {', '.join(sorted(unknown))}")
    ctx = torch.device("meta") if empty else contextlib.nullcontext()
    with ctx:
        return net(cfg=cfg, **options)


def describe_cfg(cfg: list | dict | None) -> str:
    """A cfg for one line of text: a family's list as it is; a traced network's
    {factor layer name: width} as a count (the widths are in the checkpoint)."""
    if isinstance(cfg, dict):
        return f"the widths of {len(cfg)} layers with a scaling factor"
    return "default widths" if cfg is None else str(cfg)


def check_input_size(model: nn.Module, input_size: tuple[int, ...]) -> None:
    """Raise SlimmingError unless one image of ``input_size`` (C, H, W) goes through ``model``
    to (1, num_classes) logits. Checked on a meta-device copy of the architecture: shapes only,
    so a wrong or huge size costs nothing before it is refused."""
    shown = ",".join(map(str, input_size))
    native = ",".join(map(str, getattr(model, "input_size", None) or ()))
    meta = build(model.arch, cfg=model.cfg, empty=True, **model.options).eval()
    try:
        with torch.no_grad():
            out = meta(torch.empty(1, *input_size, device="meta"))
    except (RuntimeError, ValueError, IndexError) as e:
        raise SlimmingError(f"input_size {shown} does not fit this {model.arch} "
                            f"({first_line(e, 120)}); it takes {native}", param="input_size") from None
    want = (1, model.options.get("num_classes"))
    if tuple(out.shape) != want:
        raise SlimmingError(f"input_size {shown} gives outputs of shape {tuple(out.shape)}, not "
                            f"{want}: this {model.arch} takes {native}", param="input_size")
