"""Gates: a per-channel scaling factor where a network has none (a transformer's or ConvNeXt's
MLP hidden width, between its two linear layers), or one per attention head (``HeadGate``,
before the projection that reads the heads merged). A ``ChannelGate`` (ones at the start) scales
the input of the layer that reads those channels, from a forward pre-hook on that layer, so the
network's code and its other state_dict keys stay as they were; the gate is the reader's child
``slimming_gate`` (``fc2.slimming_gate.weight``). ``Sparsity`` trains it toward zero as the
paper trains a BatchNorm's gamma; the trace scores it; at the cut ``fold`` multiplies it into
the reader's input columns and removes it, so the pruned network has no extra module.

Why a gate before the reader: a zero gate makes its channel give zero to the reader whatever
the activation before it is (GELU of a gated value would not be zero), so cutting the channel
is exact. A bare scaling factor next to a linear layer is a weaker signal than a BatchNorm's
gamma (the paper's objection): the reader's columns can grow while the gate shrinks. Weight
decay on the reader's weight keeps that in check (every optimizer slimming builds decays it);
``benchmarks/RESULTS.md`` measures it.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import SlimmingError, clip
from .attention import MultiheadAttention
from .rules import ChannelGate, HeadGate

ATTR = "slimming_gate"


def _apply(module: nn.Module, args: tuple):
    gate = getattr(module, ATTR, None)
    if gate is None or not args:
        return None
    return (gate(args[0]), *args[1:])


def gated_layers(model: nn.Module, heads: bool = False) -> dict[str, int]:
    """{reader name: its gate's width} for every layer of ``model`` with a gate per channel;
    ``heads``: {reader name: number of heads} for those with a gate per head instead."""
    return {name: getattr(m, ATTR).weight.numel() for name, m in model.named_modules()
            if isinstance(getattr(m, ATTR, None), ChannelGate)
            and isinstance(getattr(m, ATTR), HeadGate) == heads}


def attach(model: nn.Module, layers: dict[str, int] | list[str], heads: bool = False) -> list[str]:
    """Give each named layer (a ``Linear``, or a convolution of one group, transposed or not) a
    gate of ones over the channels it reads (``layers``: names, or {name: width} as ``gated_layers`` gives); a
    layer with a gate already keeps it. ``heads``: a gate per attention head instead, over the
    heads it reads merged (``layers``: {name: number of heads}). Returns the names.
    SlimmingError (nothing changed) for a name that is no such layer."""
    names = list(layers)
    found = dict(model.named_modules())
    widths = {}
    for name in names:
        m = found.get(name)
        if not isinstance(m, (nn.Linear, nn.modules.conv._ConvNd)) or getattr(m, "groups", 1) != 1:
            raise SlimmingError(f"add_gates: {clip(name)} is no linear layer or convolution of one group of "
                                f"{type(model).__name__}", param="at")
        widths[name] = width = m.in_features if isinstance(m, nn.Linear) else m.in_channels
        count = layers[name] if isinstance(layers, dict) else None
        if heads and not (isinstance(count, int) and count >= 1 and width % count == 0):
            raise SlimmingError(f"add_gates: {clip(name)} reads {width} channels, which are not "
                                f"{clip(repr(count))} equal heads", param="at")
        if not heads and count is not None and count != width:
            raise SlimmingError(f"add_gates: {clip(name)} reads {width} channels, not {count}", param="at")
        if heads:
            widths[name] = count
    for name in names:
        m = found[name]
        if isinstance(getattr(m, ATTR, None), ChannelGate):
            continue
        p = next(m.parameters())
        gate = (HeadGate if heads else ChannelGate)(widths[name], -1 if isinstance(m, nn.Linear) else 1)
        m.add_module(ATTR, gate.to(p.device, p.dtype))
        m.register_forward_pre_hook(_apply)
        parent = found[name.rpartition(".")[0]]
        if type(parent) is nn.MultiheadAttention and parent.out_proj is m:
            parent.__class__ = MultiheadAttention  # torch's forward never calls out_proj (nor its gate)
    return names


@torch.no_grad()
def fold(model: nn.Module, only: set[str] | None = None, multiply: bool = True) -> list[str]:
    """Multiply every gate of ``model`` into its reader's input columns and remove it (its
    hook too), in place; the network computes the same. Returns the readers' names.
    ``only``: those readers alone; ``multiply=False``: remove without folding, for gates that
    never ran (a reader its network calls through its weight, ``F.linear(x, self.proj.weight)``,
    never runs its hooks: the network computed without the gate)."""
    folded = []
    for name, m in list(model.named_modules()):
        gate = getattr(m, ATTR, None)
        if not isinstance(gate, ChannelGate) or (only is not None and name not in only):
            continue
        w = m.weight
        shape = [1] * w.dim()
        shape[0 if getattr(m, "transposed", False) else 1] = -1  # a transposed convolution: (in, out, ...)
        scale = gate.weight.detach().to(w.dtype)
        if isinstance(gate, HeadGate):  # each head's weight over its run of the columns
            scale = scale.repeat_interleave(w.shape[1] // scale.numel())
        if multiply:
            w.mul_(scale.view(shape))
        del m._modules[ATTR]
        for key, hook in list(m._forward_pre_hooks.items()):
            if hook is _apply:
                del m._forward_pre_hooks[key]
        folded.append(name)
    return folded
