"""What cutting channels of a normalisation over them promises (a layer whose rule
``normalises``: a LayerNorm, an RMSNorm, one of your own). A LayerNorm over the channels
(ConvNeXt's, in either layout; a transformer's over its embedding) normalises each channel by
the mean and variance of all of them (an RMSNorm by their root mean square), so no zeroed gamma
makes a channel vanish from the others' statistics: the pruned network's norm normalises over
the kept channels only. Its reference, what the pruned network equals (``verify.check``) and
what compensation measures the cut channels' constants on (``repair``), is therefore the
original with the cut channels' gamma and beta zeroed *and* each such norm's statistics taken
over its kept channels: ``kept_statistics``. A LayerNorm is known by the ``layer_norm`` it
calls; a norm followed whole as a module (``nn.RMSNorm``, a registered kind) runs, for its kept
channels, as its rule cuts it.
A network trained sparse has its cut gammas near zero, so the statistics move by what the cut
channels' inputs weighed in them; fine-tuning, as after any cut, takes up the rest.
"""

from __future__ import annotations

import contextlib
import copy

import torch
from torch import nn
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

from ..layers.rules import RULES, layer_kind
from .ops import arg, op_name


class _KeptStatistics(TorchFunctionMode):
    """Every ``layer_norm`` called with one of the given weights normalises over the kept
    channels (the last dim); the cut ones give their beta (zero once it is zeroed)."""

    def __init__(self, keep: dict[int, torch.Tensor]):
        super().__init__()
        self.keep = keep

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # every op of a kept norm's forward passes here: the name first
        if "layer_norm" in getattr(func, "__name__", "") and op_name(func) == "layer_norm":
            weight = arg(args, kwargs, 2, "weight")
            keep = self.keep.get(id(weight)) if isinstance(weight, torch.Tensor) else None
            if keep is not None:
                x, bias = args[0], arg(args, kwargs, 3, "bias")
                eps = arg(args, kwargs, 4, "eps", 1e-5)
                k = keep.to(x.device)
                out = bias.expand_as(x).clone() if bias is not None else torch.zeros_like(x)
                out[..., k] = F.layer_norm(x[..., k], (int(k.sum()),), weight[k],
                                           None if bias is None else bias[k], eps)
                return out
        return func(*args, **kwargs)


def _with_kept(forward, keep: dict[int, torch.Tensor]):
    """A module's ``forward`` in which each ``layer_norm`` called with one of ``keep``'s weights
    normalises over the kept channels: the mode is on while that forward runs only (on every
    op of the whole network, it cost a LayerNorm network's check a tenth of its time)."""
    def kept_forward(*args, **kwargs):
        with _KeptStatistics(keep):
            return forward(*args, **kwargs)
    return kept_forward


def _over_kept(forward, cut: nn.Module, keep: torch.Tensor):
    """A module's ``forward`` whose output on its kept channels (the last dim) is what ``cut``
    (the module as its rule cuts it) gives on them; the cut ones stay as ``forward`` gave them.
    The forward itself, not a hook: every hook sees the output as the reference has it."""
    def kept_forward(x, *args, **kwargs):
        out = forward(x, *args, **kwargs)
        k = keep.to(out.device)
        new = out.clone()
        new[..., k] = cut(x[..., k], *args, **kwargs)
        return new
    return kept_forward


@contextlib.contextmanager
def kept_statistics(model: nn.Module, masks: dict[str, torch.Tensor]):
    """While the block runs, each normalisation of ``model`` that ``masks`` (factor layer name
    -> keep) cuts normalises over its kept channels; nothing else changes."""
    keep, replaced = {}, []
    try:
        for name, mask in masks.items():
            m = model.get_submodule(name)
            if bool(mask.all()) or getattr(m, "weight", None) is None:
                continue
            kind = layer_kind(m)
            if kind is None or not RULES[kind].normalises:
                continue
            if not RULES[kind].calls:  # followed whole (an RMSNorm): its forward, over the kept
                cut = copy.deepcopy(m)
                RULES[kind].cut(cut, {"channels": mask.to(m.weight.device)})
                replaced.append((m, m.__dict__.get("forward")))
                m.forward = _over_kept(m.forward, cut, mask)
            else:  # known by its call (F.layer_norm): that call in its forward, over the kept
                keep[id(m.weight)] = mask
                replaced.append((m, m.__dict__.get("forward")))
                m.forward = _with_kept(m.forward, keep)
        yield model
    finally:
        for m, forward in reversed(replaced):
            if forward is None:
                del m.forward
            else:
                m.forward = forward
