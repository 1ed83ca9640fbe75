"""Layers a cut emptied, replaced by what they still compute: nothing, or a constant.

Where every channel of a width inside a residual branch is cut (``slimming.pruning.branches``
says where that may be), the layers that made those channels make none, and the layers that
read only them see nothing: torch refuses a layer of zero channels, so each becomes one of
these two, and the branch costs two cheap writes instead of its layers.

``Emptied``: a layer whose every output channel is cut (the convolution or linear layer that
made them, a BatchNorm, GroupNorm, LayerNorm or gate carrying them, a depthwise convolution),
or whose output only such layers read (``slimming.pruning.branches.unread``).
It returns a tensor of no channels with the shape the layer's output had otherwise: the
batch, and the positions a convolution's kernel, stride, padding and dilation give.
``Constant``: a convolution or linear layer every input channel of which is cut: what it
computes is its bias at every position (zero input, zero padding), so it returns its kept
bias there, a trainable parameter that fine-tuning keeps learning, as the layer's bias was.

Both keep the name of the class they replace (``was``); ``save_pruned`` writes
``removed_layers`` (names and which of the two, no code) and ``load_pruned`` replaces the same
layers of a freshly built network (``remove_again``) before giving it the file's weights.
"""

import torch
from torch import nn

from ..errors import CheckpointError, clip
from .rules import layer_kind

_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
# the kinds of layer an Emptied replaces by passing no channels on
NORMS = ("bn", "frozen_bn", "instance_norm", "group_norm", "layer_norm", "rms_norm")
# LayerNorms that permute their input's channels last and back (timm's): channels at dim 1
CHANNELS_FIRST_NORMS = ("LayerNorm2d", "LayerNorm3d")


class _Shaped(nn.Module):
    """The output shape of the layer it replaces: a convolution's positions from its geometry
    (``kernel`` empty: not a convolution; ``same``: TensorFlow's SAME padding, ceil(n / stride)),
    else the input's shape."""

    # declared for TorchScript, which cannot type an empty list by itself (and reads no string
    # annotations: this module has no ``from __future__ import annotations``)
    kernel: list[int]
    stride: list[int]
    dilation: list[int]
    padding: list[int]

    def __init__(self, layer: nn.Module):
        super().__init__()
        conv = isinstance(layer, _CONVS)
        dims = len(layer.kernel_size) if conv else 0
        padding = getattr(layer, "padding", 0)
        self.same = conv and (padding == "same" or getattr(layer, "same_pad", False) is True
                              or type(layer).__name__ == "Conv2dSame")
        self.kernel: list[int] = list(layer.kernel_size) if conv else []
        self.stride: list[int] = list(layer.stride) if conv else []
        self.dilation: list[int] = list(layer.dilation) if conv else []
        self.padding: list[int] = [0] * dims if not conv or isinstance(padding, str) else list(padding)
        self.was = layer.was if isinstance(layer, _Shaped) else type(layer).__name__  # the class it replaces
        self.layer = conv or isinstance(layer, nn.Linear)  # a convolution or linear layer (not a norm)

    def positions(self, x: torch.Tensor) -> list[int]:
        """The positions (spatial sizes) of the replaced convolution's output for ``x``."""
        n = len(self.kernel)
        out: list[int] = []
        for i in range(n):
            size = x.shape[x.dim() - n + i]
            if self.same:
                out.append((size + self.stride[i] - 1) // self.stride[i])
            else:
                span = self.dilation[i] * (self.kernel[i] - 1) + 1
                out.append((size + 2 * self.padding[i] - span) // self.stride[i] + 1)
        return out

    def extra_repr(self) -> str:
        return f"was={self.was}"


def channel_dim(layer: nn.Module) -> int:
    """The dim of ``layer``'s output its channels are at, as ``Emptied`` narrows it: the last
    for a linear layer, a LayerNorm, an RMSNorm (but timm's ``LayerNorm2d``), else 1."""
    last = isinstance(layer, (nn.Linear, nn.LayerNorm, nn.RMSNorm))
    return -1 if last and type(layer).__name__ not in CHANNELS_FIRST_NORMS else 1


class Emptied(_Shaped):
    """A layer whose every output channel is cut: a tensor of none along its channels' dim (the
    last for a linear layer, a LayerNorm, an RMSNorm, but timm's ``LayerNorm2d``; else 1),
    shaped as its output otherwise is."""

    def __init__(self, layer: nn.Module):
        super().__init__(layer)
        self.dim = channel_dim(layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if len(self.kernel) == 0:
            return x.narrow(self.dim, 0, 0)
        return x.new_zeros([x.shape[0], 0] + self.positions(x))


class Constant(_Shaped):
    """A convolution or linear layer whose every input channel is cut: its bias (zeros where it
    had none) at every position of its output."""

    def __init__(self, layer: nn.Module, bias: torch.Tensor | None = None):
        super().__init__(layer)
        if bias is None:
            out = layer.out_channels if isinstance(layer, _CONVS) else layer.out_features
            p = next(iter(layer.parameters()), None)
            bias = torch.zeros(out, device=p.device if p is not None else None,
                               dtype=p.dtype if p is not None else None)
        self.bias = nn.Parameter(bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.bias.to(x.dtype) if x.is_floating_point() else self.bias
        if len(self.kernel) == 0:  # a linear layer: features last
            out = bias.expand(list(x.shape[:-1]) + [bias.shape[0]])
        else:
            positions = self.positions(x)
            out = bias.view([1, bias.shape[0]] + [1] * len(positions)).expand([x.shape[0], bias.shape[0]]
                                                                             + positions)
        # a tensor of its own, never the parameter or a view of it: the caller may write in it
        # (``out += identity``), and autograd sees a function of the bias
        return out.clone(memory_format=torch.contiguous_format)


def removable_layer(module: nn.Module, kind: str) -> bool:
    """Whether ``module`` (of layer kind ``kind``) can be replaced by ``Emptied`` or
    ``Constant``: a torch convolution (not transposed) or linear layer, or a module of a
    channel-wise rule (a norm, a gate), whose output is all its replacement must give."""
    if kind in ("conv", "depthwise"):
        return isinstance(module, _CONVS) and getattr(module, "padding_mode", "zeros") == "zeros"
    if kind == "linear":
        return isinstance(module, nn.Linear)
    return kind in NORMS


def removed_layers(model: nn.Module, layers_only: bool = False) -> dict[str, str]:
    """{name: "Emptied" or "Constant"} for every layer of ``model`` a cut replaced (``layers_only``:
    those that were convolutions or linear layers, not norms)."""
    return {name: type(m).__name__ for name, m in model.named_modules()
            if isinstance(m, (Emptied, Constant)) and (m.layer or not layers_only)}


def replace(model: nn.Module, name: str, new: nn.Module) -> None:
    """``model``'s module ``name`` replaced by ``new`` wherever the model holds it (a module
    used in two places is one object in both)."""
    old = model.get_submodule(name)
    for parent in model.modules():
        for key, child in list(parent._modules.items()):
            if child is old:
                parent._modules[key] = new


def remove_again(model: nn.Module, removed, state: dict, path) -> None:
    """Replace the layers ``removed`` (a file's {name: "Emptied" / "Constant"}) of a freshly
    built ``model``, so that it takes the file's weights; CheckpointError (one line) for an
    entry that is not one of its layers that can be replaced so."""
    if removed is None:
        return
    if not isinstance(removed, dict) or not all(isinstance(k, str) and v in ("Emptied", "Constant")
                                                for k, v in removed.items()):
        raise CheckpointError(f"{path}: its removed layers are not a dict of layer names to 'Emptied' "
                              "or 'Constant'")
    modules = dict(model.named_modules())
    for name, what in removed.items():
        m = modules.get(name)
        bias = state.get(f"{name}.bias")
        kind = layer_kind(m) if m is not None else None
        if kind is None or not removable_layer(m, kind) or (what == "Constant" and (
                kind not in ("conv", "linear") or not isinstance(bias, torch.Tensor) or bias.dim() != 1)):
            raise CheckpointError(f"{path}: it removes {clip(name)}, which is no layer of "
                                  f"{type(model).__name__} it can replace by {what}")
        if isinstance(m, (Emptied, Constant)):
            continue
        replace(model, name, Emptied(m) if what == "Emptied" else Constant(m, torch.zeros(len(bias))))
