"""Layers whose forward computes the weight it convolves with from its own parameters, baked at
the cut into the plain layer they compute.

Weight standardisation (timm's ``StdConv2d`` and ``StdConv2dSame`` in BiT ResNet-V2s and ViT
hybrids, ``ScaledStdConv2d`` in NFNets, a detector's ``ConvWS2d`` of your own) convolves with
each output row of its weight shifted and scaled by that row's own mean and variance. Cutting
the rows would stay exact; cutting the input channels would not, while the layer standardises:
each row's mean and variance change with the columns it loses. So where the cut touches such a
layer, the weight its forward computed (``Baked.computed``: what the trace saw it convolve
with, from its parameters alone) becomes its weight, cut like any convolution's, and the layer
becomes the plain one it ran (``nn.Conv2d``; ``Conv2dSame`` where it padded its input as
TensorFlow's SAME does): exactly what the original computed, on the kept channels. Its other
parameters (NFNets' per-row ``gain``) go; it no longer standardises when fine-tuned.

A pruned network says which layers were baked (``baked_layers``: the class each was, kept on
it); ``save_pruned`` and the CLI's checkpoints keep their names, and loading bakes the same
layers of the freshly built network (``rebake``) before giving it the file's weights.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import CheckpointError, SlimmingError, clip

BAKED = "_slimming_baked"  # attribute of a baked layer: the name of the class it was
_PLAIN = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)


def same_pads(size: int, kernel: int, stride: int, dilation: int) -> tuple[int, int]:
    """The zeros TensorFlow's SAME padding puts before and after a dim of ``size``."""
    total = max((math.ceil(size / stride) - 1) * stride + (kernel - 1) * dilation + 1 - size, 0)
    return total // 2, total - total // 2


def pad_same(x: torch.Tensor, kernel, stride, dilation) -> torch.Tensor:
    """``x`` (N, C, H, W) padded with zeros as TensorFlow's SAME padding does for that kernel."""
    (top, bottom), (left, right) = (same_pads(n, k, s, d) for n, k, s, d in
                                    zip(x.shape[-2:], kernel, stride, dilation))
    return F.pad(x, [left, right, top, bottom])


class Conv2dSame(nn.Conv2d):
    """A convolution padding its input as TensorFlow's SAME does (the input size decides the
    zeros on each side; ``padding`` is 0): what a baked ``StdConv2dSame`` runs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(pad_same(x, self.kernel_size, self.stride, self.dilation), self.weight,
                                  self.bias)


def plain_class(module: nn.Module) -> type | None:
    """The plain layer ``module`` runs once its weight is baked: the torch convolution or linear
    layer it derives from (``Conv2dSame`` for one with timm's ``same_pad`` set); None for others."""
    base = next((c for c in type(module).__mro__ if c in _PLAIN), None)
    if base is nn.Conv2d and getattr(module, "same_pad", False) is True:
        return Conv2dSame
    return base


def bake(module: nn.Module, weight: torch.Tensor | None = None) -> None:
    """``module``, in place, the plain layer it runs (``plain_class``) with ``weight`` (what its
    forward computed; None: its weight as it is, a loaded file's) as its weight; its other
    parameters but the bias dropped. The class it was is kept on it (``BAKED``)."""
    plain = plain_class(module)
    if plain is None:
        raise SlimmingError(f"{type(module).__name__} is no convolution or linear layer: its weight cannot "
                            "be baked")
    was = type(module).__name__
    if weight is not None:
        module._parameters["weight"] = nn.Parameter(weight.detach().clone(),
                                                    requires_grad=module.weight.requires_grad)
    for key in [k for k in module._parameters if k not in ("weight", "bias")]:
        del module._parameters[key]
    module.__class__ = plain
    if BAKED not in vars(module):
        vars(module)[BAKED] = was


def baked_layers(model: nn.Module) -> list[str]:
    """The names of ``model``'s baked layers."""
    return [name for name, m in model.named_modules() if BAKED in vars(m)]


def rebake(model: nn.Module, names, path) -> None:
    """Bake the layers ``names`` (a file's list) of a freshly built ``model``, so that they take
    the file's baked weights; CheckpointError (one line) for a list that is not one of its
    convolution or linear layers."""
    if names is None:
        return
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise CheckpointError(f"{path}: its baked layers are not a list of layer names")
    modules = dict(model.named_modules())
    for name in names:
        m = modules.get(name)
        if m is None or plain_class(m) is None:
            raise CheckpointError(f"{path}: it bakes {clip(name)}, which is no convolution or linear "
                                  f"layer of {type(model).__name__}")
        if BAKED not in vars(m):
            bake(m)
