"""How to cut a traced network, once the keep-masks of its channel groups are known.

``plan`` turns group masks into per-module masks through the channel graph (a convolution
keeps the output channels of its own group and the input channels of whatever it reads; a
depthwise convolution and a BatchNorm keep the channels they carry; a linear layer keeps the
columns of the channels it reads, ``factor`` columns each after a flatten). ``cut`` applies the
plan to a copy of the model. ``resize_like`` gives a freshly built (meta) network the shapes
of a pruned state_dict, which is how a pruned torchvision/timm checkpoint rebuilds itself.
"""

from __future__ import annotations

import torch
from torch import nn

from .errors import CheckpointError
from .graph import ChannelGraph, GraphError, Map, structure_copy

BN_TENSORS = ("weight", "bias", "running_mean", "running_var")


def plan(graph: ChannelGraph, group_masks: dict[int, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """{module name: {"in"/"out"/"channels": bool mask}} for every module the masks cut.
    ``group_masks`` maps a space's root (``graph.find``) to its keep-mask; groups absent
    from it keep every channel."""
    def mask_of(m: Map) -> torch.Tensor:
        parts = []
        for seg in m.segs:
            whole = group_masks.get(graph.find(seg.space))
            parts.append(torch.ones(seg.length, dtype=torch.bool) if whole is None
                         else whole[seg.start:seg.start + seg.length])
        return torch.cat(parts).repeat_interleave(m.factor)

    where = {"conv_in": "in", "linear_in": "in", "conv_out": "out", "linear_out": "out",
             "depthwise": "channels", "bn": "channels"}
    out: dict[str, dict[str, torch.Tensor]] = {}
    for use in graph.uses:
        mask = mask_of(use.map)
        slot = out.setdefault(use.module, {})
        key = where[use.kind]
        if key in slot and not torch.equal(slot[key], mask):
            raise GraphError(f"{use.module} is used twice on different channels; slimming cannot "
                             "cut a shared module two ways (list it in ignore=)")
        slot[key] = mask
    return {name: masks for name, masks in out.items() if not all(m.all() for m in masks.values())}


def _keep(t: torch.Tensor | None, mask: torch.Tensor | None, dim: int = 0) -> torch.Tensor | None:
    """The kept slices of ``t`` along ``dim``, in new memory (``index_select`` copies)."""
    if t is None or mask is None:
        return t
    return t.detach().index_select(dim, mask.nonzero().squeeze(1).to(t.device))


def _set(m: nn.Module, name: str, value: torch.Tensor | None, parameter: bool) -> None:
    if value is None:
        return
    if parameter:
        setattr(m, name, nn.Parameter(value, requires_grad=getattr(m, name).requires_grad))
    else:
        setattr(m, name, value)


def cut(model: nn.Module, masks: dict[str, dict[str, torch.Tensor]]) -> nn.Module:
    """A copy of ``model`` with every module in ``masks`` cut to its kept channels; the
    original is left untouched (no tensor is shared between the two)."""
    new = structure_copy(model)
    for name, keep in masks.items():
        m = new.get_submodule(name)
        if isinstance(m, nn.Conv2d):
            if "channels" in keep:  # depthwise: channel c in, channel c out
                c = keep["channels"]
                _set(m, "weight", _keep(m.weight, c), True)
                _set(m, "bias", _keep(m.bias, c), True)
                m.in_channels = m.out_channels = m.groups = int(c.sum())
            else:
                _set(m, "weight", _keep(_keep(m.weight, keep.get("out")), keep.get("in"), 1), True)
                _set(m, "bias", _keep(m.bias, keep.get("out")), True)
                m.out_channels, m.in_channels = m.weight.shape[0], m.weight.shape[1]
        elif isinstance(m, nn.modules.batchnorm._BatchNorm):
            c = keep["channels"]
            for t in BN_TENSORS:
                _set(m, t, _keep(getattr(m, t), c), t in ("weight", "bias"))
            m.num_features = int(c.sum())
        elif isinstance(m, nn.Linear):
            _set(m, "weight", _keep(_keep(m.weight, keep.get("out")), keep.get("in"), 1), True)
            _set(m, "bias", _keep(m.bias, keep.get("out")), True)
            m.out_features, m.in_features = m.weight.shape
    shared = {id(t) for t in (*model.parameters(), *model.buffers())}
    for m in new.modules():  # everything not cut: its own copy, not the original's tensor
        for key, p in list(m._parameters.items()):
            if p is not None and id(p) in shared:
                m._parameters[key] = nn.Parameter(p.detach().clone(), requires_grad=p.requires_grad)
        for key, b in list(m._buffers.items()):
            if b is not None and id(b) in shared:
                m._buffers[key] = b.clone()
    return new


def _empty_like(m: nn.Module, name: str, shape: tuple[int, ...], parameter: bool) -> None:
    old = getattr(m, name)
    if old is None:
        return
    t = torch.empty(shape, dtype=old.dtype, device=old.device)
    _set(m, name, t, parameter)


def resize_like(model: nn.Module, state_dict: dict, path: str = "checkpoint") -> None:
    """Give every Conv2d, BatchNorm and Linear of ``model`` (built on the meta device) the
    width its weights have in ``state_dict``, in place, so that ``load_state_dict`` fits. Only
    widths change: kernel sizes, strides and the kind of a convolution stay as built."""
    for name, m in model.named_modules():
        prefix = f"{name}." if name else ""
        if isinstance(m, nn.Conv2d):
            w = state_dict.get(prefix + "weight")
            if w is None or tuple(w.shape) == tuple(m.weight.shape):
                continue
            if tuple(w.shape[2:]) != tuple(m.weight.shape[2:]) or w.dim() != 4:
                raise CheckpointError(f"{path}: {prefix}weight has shape {tuple(w.shape)}, not a "
                                      f"{tuple(m.weight.shape[2:])} convolution's")
            if m.groups > 1 and m.groups == m.in_channels == m.out_channels:
                if w.shape[1] != 1:
                    raise CheckpointError(f"{path}: {prefix}weight is not a depthwise kernel")
                m.in_channels = m.out_channels = m.groups = w.shape[0]
            elif m.groups == 1:
                m.out_channels, m.in_channels = w.shape[0], w.shape[1]
            else:
                raise CheckpointError(f"{path}: {prefix}weight: the grouped convolution {name} "
                                      "is never cut, yet its shape differs")
            _empty_like(m, "weight", tuple(w.shape), True)
            _empty_like(m, "bias", (w.shape[0],), True)
        elif isinstance(m, nn.modules.batchnorm._BatchNorm):
            stats = state_dict.get(prefix + "running_mean", state_dict.get(prefix + "weight"))
            if stats is None or stats.dim() != 1 or stats.numel() == m.num_features:
                continue
            m.num_features = stats.numel()
            for t in BN_TENSORS:
                _empty_like(m, t, (m.num_features,), t in ("weight", "bias"))
        elif isinstance(m, nn.Linear):
            w = state_dict.get(prefix + "weight")
            if w is None or tuple(w.shape) == tuple(m.weight.shape):
                continue
            if w.dim() != 2:
                raise CheckpointError(f"{path}: {prefix}weight is not a linear layer's")
            m.out_features, m.in_features = w.shape
            _empty_like(m, "weight", tuple(w.shape), True)
            _empty_like(m, "bias", (w.shape[0],), True)
