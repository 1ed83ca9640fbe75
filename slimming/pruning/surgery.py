"""How to cut a traced network, once the keep-masks of its channel groups are known.

``plan`` turns group masks into per-module masks through the channel graph (a convolution
keeps the output channels of its own group and the input channels of whatever it reads; a
depthwise convolution and a (frozen) BatchNorm keep the channels they carry; a linear layer
keeps the columns of the channels it reads, ``factor`` columns each after a flatten; a
transposed convolution's weight is (in, out, k, k); a grouped convolution keeps in every group
the same number of input and of output channels). ``cut`` applies the plan to a copy of the
model.
(``slimming.models.external.resize_like`` is the way back: a freshly built network given a
pruned state_dict's widths.)
"""

from __future__ import annotations

import torch
from torch import nn

from ..models.common import BN_STATE
from ..utils.modules import keep_slices, set_tensor
from .graph import ChannelGraph, GraphError, Map, structure_copy


def plan(graph: ChannelGraph, group_masks: dict[int, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """{module name: {"in"/"out"/"channels": bool mask}} for every module the masks cut.
    ``group_masks`` maps a space's root (``graph.find``) to its keep-mask; groups absent
    from it keep every channel."""
    def mask_of(m: Map) -> torch.Tensor:
        parts = []
        for seg in graph.resolve(m).segs:
            whole = group_masks.get(graph.find(seg.space))
            parts.append(torch.ones(seg.length, dtype=torch.bool) if whole is None
                         else whole[seg.start:seg.start + seg.length])
        return torch.cat(parts).repeat_interleave(m.factor)

    where = {"conv_in": "in", "linear_in": "in", "convt_in": "in", "conv_out": "out",
             "linear_out": "out", "convt_out": "out", "depthwise": "channels", "bn": "channels",
             "frozen_bn": "channels"}
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
    """``t`` cut to ``mask`` along ``dim``; ``t`` itself when either is None."""
    return t if t is None or mask is None else keep_slices(t, mask, dim)


def _grouped(m: nn.Conv2d, keep_in: torch.Tensor | None, keep_out: torch.Tensor | None) -> torch.Tensor:
    """A grouped convolution's weight (out, in/groups, k, k) cut to the kept channels: every
    group keeps the same number of inputs and of outputs (the graph's equal-count blocks)."""
    g, w = m.groups, m.weight.detach()
    keep_in = torch.ones(m.in_channels, dtype=torch.bool) if keep_in is None else keep_in.cpu()
    keep_out = torch.ones(m.out_channels, dtype=torch.bool) if keep_out is None else keep_out.cpu()
    ins, outs = keep_in.view(g, -1), keep_out.view(g, -1)
    if len(set(ins.sum(1).tolist())) > 1 or len(set(outs.sum(1).tolist())) > 1:
        raise GraphError(f"the grouped convolution {m} would keep unequal groups")
    blocks = w.view(g, -1, *w.shape[1:])
    parts = [blocks[j][outs[j].to(w.device)][:, ins[j].to(w.device)] for j in range(g)]
    return torch.cat(parts).clone()


def cut(model: nn.Module, masks: dict[str, dict[str, torch.Tensor]]) -> nn.Module:
    """A copy of ``model`` with every module in ``masks`` cut to its kept channels; the
    original is left untouched (no tensor is shared between the two)."""
    new = structure_copy(model)
    for name, keep in masks.items():
        m = new.get_submodule(name)
        if isinstance(m, nn.Conv2d):
            if "channels" in keep:  # depthwise: channel c in, channel c out
                c = keep["channels"]
                set_tensor(m, "weight", _keep(m.weight, c), True)
                set_tensor(m, "bias", _keep(m.bias, c), True)
                m.in_channels = m.out_channels = m.groups = int(c.sum())
            elif m.groups > 1:
                set_tensor(m, "weight", _grouped(m, keep.get("in"), keep.get("out")), True)
                set_tensor(m, "bias", _keep(m.bias, keep.get("out")), True)
                m.out_channels, m.in_channels = m.weight.shape[0], m.weight.shape[1] * m.groups
            else:
                set_tensor(m, "weight", _keep(_keep(m.weight, keep.get("out")), keep.get("in"), 1), True)
                set_tensor(m, "bias", _keep(m.bias, keep.get("out")), True)
                m.out_channels, m.in_channels = m.weight.shape[0], m.weight.shape[1]
        elif isinstance(m, nn.ConvTranspose2d):
            set_tensor(m, "weight", _keep(_keep(m.weight, keep.get("in")), keep.get("out"), 1), True)
            set_tensor(m, "bias", _keep(m.bias, keep.get("out")), True)
            m.in_channels, m.out_channels = m.weight.shape[0], m.weight.shape[1]
        elif isinstance(m, nn.modules.batchnorm._BatchNorm) or "channels" in keep:
            c = keep["channels"]  # a BatchNorm, or a frozen one (the same four tensors, as buffers)
            for t in BN_STATE:
                if getattr(m, t, None) is not None:
                    set_tensor(m, t, _keep(getattr(m, t), c), t in m._parameters)
            if hasattr(m, "num_features"):
                m.num_features = int(c.sum())
        elif isinstance(m, nn.Linear):
            set_tensor(m, "weight", _keep(_keep(m.weight, keep.get("out")), keep.get("in"), 1), True)
            set_tensor(m, "bias", _keep(m.bias, keep.get("out")), True)
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
