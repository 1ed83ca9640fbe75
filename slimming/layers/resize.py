"""A network built at its full widths, given the widths of a pruned one: how a pruned
torchvision, timm or user network rebuilds itself from its file.

``resize_like(model, state_dict)`` gives every layer of a freshly built (meta) network the width
its tensors have in the state_dict, each by the rule of its kind (``slimming.layers.rules``);
``int_attributes`` and ``set_int_attributes`` save and restore the integer attributes a cut set
(widths, numbers of heads), refusing a file that changes anything else.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import CheckpointError, clip
from ..utils.modules import set_tensor
from .rules import RULES, is_layer, layer_kind, resize_layer


def _empty_like(m: nn.Module, name: str, shape: tuple[int, ...], parameter: bool) -> None:
    old = getattr(m, name)
    if old is None:
        return
    t = torch.empty(shape, dtype=old.dtype, device=old.device)
    set_tensor(m, name, t, parameter)


def resize_like(model: nn.Module, state_dict: dict, path: str = "checkpoint") -> None:
    """Give every layer of ``model`` (built on the meta device) the width its tensors have in
    ``state_dict``, in place, so that ``load_state_dict`` fits: each by the rule of its kind
    (``slimming.layers.rules``). Only widths change: kernel sizes, strides and the kind of a
    convolution stay as built. Other modules' tensors (a layer scale, a blur filter) take the
    state_dict's shape where it is only narrower, as a cut makes them."""
    for name, m in model.named_modules():
        prefix = f"{name}." if name else ""
        if is_layer(m):
            resize_layer(m, state_dict, prefix, path)
            continue
        for key, t in (*m._parameters.items(), *m._buffers.items()):
            new = state_dict.get(prefix + key)
            if isinstance(t, torch.Tensor) and isinstance(new, torch.Tensor) and new.shape != t.shape \
                    and new.dim() == t.dim() and all(a <= b for a, b in zip(new.shape, t.shape)):
                _empty_like(m, key, tuple(new.shape), key in m._parameters)


def int_attributes(model: nn.Module) -> dict[str, int]:
    """{"module.attribute": value} for every public integer attribute of ``model``'s modules."""
    return {f"{name}.{attr}" if name else attr: v for name, m in model.named_modules()
            for attr, v in vars(m).items() if type(v) is int and not attr.startswith("_")}


# the integer attributes of torch's own modules a cut changes, beside those their rule names
_TORCH_WIDTHS = {nn.modules.conv._ConvNd: {"groups"}, nn.GroupNorm: {"num_groups"},
                 nn.MultiheadAttention: {"embed_dim", "kdim", "vdim", "num_heads", "head_dim"}}


def _widths_of(m: nn.Module) -> set[str] | None:
    """The integer attributes of ``m`` a cut may change: for torch's own modules those its
    layer rule names as widths (and a GroupNorm's groups, an attention's heads); None (any)
    for others, whose widths the cut finds by their values."""
    if not type(m).__module__.startswith("torch."):
        return None
    kind = layer_kind(m)
    named = set(RULES[kind].widths) if kind is not None else set()
    return named | next((v for t, v in _TORCH_WIDTHS.items() if isinstance(m, t)), set())


def set_int_attributes(model: nn.Module, widths, path) -> None:
    """The saved integer attributes (``int_attributes``: the widths and numbers of heads a
    cut set), set where the fresh model has that attribute as an int of at least that value (a
    cut only lowers widths; a file cannot raise one). Of torch's own modules, only those a cut
    changes (``_widths_of``): a file that changes a pool's ``kernel_size`` or a softmax's
    ``dim`` is refused."""
    if widths is None:
        return  # a file from before they were saved
    if not isinstance(widths, dict) or not all(isinstance(k, str) and type(v) is int
                                               for k, v in widths.items()):
        raise CheckpointError(f"{path}: its widths are not integer attributes by name")
    modules = dict(model.named_modules())
    for key, value in widths.items():
        name, _, attr = key.rpartition(".")
        m = modules.get(name)
        if m is None or type(vars(m).get(attr)) is not int or value == vars(m)[attr]:
            continue
        allowed = _widths_of(m)
        if allowed is not None and attr not in allowed:
            raise CheckpointError(f"{path}: its widths change {clip(key)}, which is no width a cut sets")
        if 0 <= value <= vars(m)[attr]:
            setattr(m, attr, value)
