"""Pruning: which channels to cut (a global |gamma| threshold) and how to cut them.

"Which" is architecture-free: one threshold over the |gamma| of every prunable BatchNorm layer.
"How" rebuilds ``Net(cfg)`` with the surviving widths (on the meta device) and fills it with the
kept weights, by the family's surgery in ``SURGERY``: for chain-shaped networks (NIN, VGG), a walk
over the old and new ``modules()`` side by side with a ``start_mask`` (input channels) and an
``end_mask`` (output channels), as the paper's code does; for the pre-activation ResNet and
DenseNet, whose layers read shared tensors, the family declares per BN which weights its mask
cuts (``channel_slices()``) and ``copy_sliced_weights`` applies exactly that.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from .errors import SlimmingError


def unwrap(model: nn.Module) -> nn.Module:
    """The network inside DataParallel / DistributedDataParallel / torch.compile wrappers."""
    while True:
        if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model


def prunable_bns(model: nn.Module) -> list[nn.BatchNorm2d]:
    """The BatchNorm layers whose channels may be cut: the model's own list, else every BN2d
    (SyncBatchNorm included)."""
    model = unwrap(model)
    if hasattr(model, "prunable_bns"):
        return model.prunable_bns()
    return [m for m in model.modules() if isinstance(m, (nn.BatchNorm2d, nn.SyncBatchNorm))]


def channel_masks(model: nn.Module, percent: float | None = None, threshold: float | None = None,
                  min_channels: int = 1) -> tuple[list[torch.Tensor], float | None]:
    """One boolean keep-mask per prunable BN (in ``prunable_bns`` order), and the threshold.

    ``percent=p`` ranks all N prunable channels by |gamma| and removes exactly ``floor(p * N)``
    of them, the smallest (ties broken by layer order); the returned threshold is the largest
    |gamma| removed (None when none is). ``threshold=t`` removes every channel with |gamma| <= t.
    Then each layer that would keep fewer than ``min_channels`` keeps its ``min_channels``
    largest-|gamma| channels (or all, if it has fewer), so no layer is ever emptied.
    Raises SlimmingError for arguments out of range and for gammas that are not finite.
    """
    masks, threshold, _ = _masks(model, percent, threshold, min_channels)
    return masks, threshold


def _masks(model: nn.Module, percent: float | None, threshold: float | None,
           min_channels: int) -> tuple[list[torch.Tensor], float | None, list[int]]:
    """``channel_masks`` plus the indices of the layers the ``min_channels`` guard refilled."""
    if (percent is None) == (threshold is None):
        raise SlimmingError("give exactly one of percent and threshold")
    if percent is not None and not (0 <= percent < 1):
        raise SlimmingError(f"percent must be in [0, 1), got {percent}")
    if threshold is not None and not (0 <= threshold < math.inf):
        raise SlimmingError(f"threshold must be >= 0 and finite, got {threshold}")
    if min_channels < 1:
        raise SlimmingError(f"min_channels must be >= 1, got {min_channels}")
    bns = prunable_bns(model)
    if not bns or any(bn.weight is None for bn in bns):
        raise SlimmingError("the model has no prunable BatchNorm2d layer with a scale (affine=True): "
                            "there is nothing to slim")
    gammas = [bn.weight.detach().abs().float().cpu() for bn in bns]
    allg = torch.cat(gammas)
    if not torch.isfinite(allg).all():
        bad = [i for i, g in enumerate(gammas) if not torch.isfinite(g).all()]
        raise SlimmingError(f"{len(bad)} BatchNorm layer(s) have non-finite gammas (nan/inf), the "
                            f"first is number {bad[0]} of {len(bns)}: the model diverged; prune a "
                            "checkpoint from before (e.g. best.pth)")
    if percent is not None:
        k = math.floor(percent * allg.numel() + 1e-9)
        order = torch.argsort(allg, stable=True)
        keep = torch.ones_like(allg, dtype=torch.bool)
        keep[order[:k]] = False
        threshold = allg[order[k - 1]].item() if k else None
    else:
        keep = allg > threshold
        if not keep.any():
            raise SlimmingError(f"threshold {threshold:g} is at or above every |gamma| (the largest "
                                f"is {allg.max().item():.4g}): it would prune every channel")
    masks = list(keep.split([g.numel() for g in gammas]))
    guarded = []
    for i, (g, m) in enumerate(zip(gammas, masks)):
        need = min(min_channels, g.numel())
        if int(m.sum()) < need:
            masks[i] = m.clone()
            masks[i][g.topk(need).indices] = True
            guarded.append(i)
    return masks, threshold, guarded


def _take(t: torch.Tensor, dim: int, mask: torch.Tensor | None) -> torch.Tensor:
    if mask is None:
        return t.detach().clone()
    return t.detach().index_select(dim, mask.nonzero().squeeze(1).to(t.device))


def copy_chain_weights(old: nn.Module, new: nn.Module, cfg_mask: list[torch.Tensor]) -> None:
    """Fill ``new`` (possibly on the meta device) with the kept weights of ``old``.

    ``cfg_mask`` has one mask per BatchNorm2d of ``old`` in ``modules()`` order. For a chain
    network (conv -> BN -> ... -> linear): a conv keeps input channels ``start_mask`` and output
    channels ``end_mask``; a BN keeps ``end_mask``; a linear keeps input columns ``start_mask``.
    Loading is strict, so a tensor this walk missed is an error, not uninitialised memory.
    """
    masks = iter(cfg_mask)
    start_mask, end_mask = None, next(masks, None)
    state = {}
    for (name, m0), (_, m1) in zip(old.named_modules(), new.named_modules()):
        if type(m0) is not type(m1):
            raise ValueError(f"module {name!r}: {type(m0).__name__} vs {type(m1).__name__}")
        prefix = f"{name}." if name else ""
        if isinstance(m0, nn.BatchNorm2d):
            for key in ("weight", "bias", "running_mean", "running_var"):
                state[prefix + key] = _take(getattr(m0, key), 0, end_mask)
            state[prefix + "num_batches_tracked"] = m0.num_batches_tracked.detach().clone()
            start_mask, end_mask = end_mask, next(masks, None)
        elif isinstance(m0, nn.Conv2d):
            state[prefix + "weight"] = _take(_take(m0.weight, 1, start_mask), 0, end_mask)
            if m0.bias is not None:
                state[prefix + "bias"] = _take(m0.bias, 0, end_mask)
        elif isinstance(m0, nn.Linear):
            state[prefix + "weight"] = _take(m0.weight, 1, start_mask)
            if m0.bias is not None:
                state[prefix + "bias"] = m0.bias.detach().clone()
    new.load_state_dict(state, assign=True)


def copy_sliced_weights(old: nn.Module, new: nn.Module, cfg_mask: list[torch.Tensor]) -> None:
    """Fill ``new`` (possibly on the meta device) with the kept weights of ``old``.

    ``old.channel_slices()`` lists, per BatchNorm2d in ``modules()`` order (``cfg_mask``'s
    order), the (state_dict key, dim) pairs whose extent along dim is that BN's channels; each
    is cut to the mask's kept channels (a conv weight may be cut twice: its output channels by
    one BN's mask, its input channels by another's). Every other tensor is copied whole. Strict
    loading turns any tensor the plan left at a wrong shape into an error.
    """
    plan = old.channel_slices()
    if len(plan) != len(cfg_mask):
        raise ValueError(f"{len(cfg_mask)} masks for {len(plan)} BatchNorm layers")
    cuts: dict[str, list[tuple[int, torch.Tensor]]] = {}
    for slices, mask in zip(plan, cfg_mask):
        for key, dim in slices:
            cuts.setdefault(key, []).append((dim, mask))
    state = {}
    for key, t in old.state_dict().items():
        t = t.detach()
        for dim, mask in cuts.pop(key, [(0, None)]):
            if mask is not None and mask.numel() != t.shape[dim]:
                raise ValueError(f"{key}: a mask of {mask.numel()} for {t.shape[dim]} channels (dim {dim})")
            t = _take(t, dim, mask)
        state[key] = t
    if cuts:
        raise ValueError(f"channel_slices() names tensors the model lacks: {', '.join(sorted(cuts))}")
    new.load_state_dict(state, assign=True)


# How each family is cut once the masks are known ("how", apart from "which": channel_masks).
SURGERY: dict[str, Callable[[nn.Module, nn.Module, list[torch.Tensor]], None]] = {
    "nin": copy_chain_weights,
    "vgg": copy_chain_weights,
    "preresnet": copy_sliced_weights,
    "densenet": copy_sliced_weights,
}


@dataclass
class PruneResult:
    """What ``prune`` returns: the smaller network and how it was cut from the original."""

    model: nn.Module
    cfg: list
    cfg_mask: list[torch.Tensor]  # one bool mask per BatchNorm2d of the original, modules() order
    threshold: float | None  # largest |gamma| removed (percent) or the threshold given
    layer_names: list[str]  # the original's BatchNorm2d names, in cfg_mask order
    guarded: list[str] = field(default_factory=list)  # BNs the min_channels guard refilled

    def layer_table(self) -> list[tuple[str, int, int]]:
        """(BN layer name, channels before, channels after) for every BatchNorm2d."""
        return [(n, m.numel(), int(m.sum())) for n, m in zip(self.layer_names, self.cfg_mask)]


def prune(model: nn.Module, percent: float | None = None, threshold: float | None = None,
          min_channels: int = 1) -> PruneResult:
    """Slim ``model`` (a NIN, VGG, pre-activation ResNet or DenseNet ``Net``): cut low-|gamma|
    channels and rebuild it thinner.

    Give ``percent`` (fraction of prunable channels removed, see ``channel_masks``) or an
    absolute ``threshold``. The original model is left untouched; the new one is on the same
    device, in the same train/eval mode, and its weights are never initialised only to be
    overwritten (it is built on the meta device and filled by assignment).
    """
    import models  # here, not at import time: the pruning core works on any Net-like model

    model = unwrap(model)
    masks, threshold, guarded = _masks(model, percent, threshold, min_channels)
    prunable = prunable_bns(model)
    by_layer = {id(bn): m for bn, m in zip(prunable, masks)}
    bns = [(name, bn) for name, bn in model.named_modules() if isinstance(bn, nn.BatchNorm2d)]
    names = {id(bn): name for name, bn in bns}
    cfg_mask = [by_layer.get(id(bn), torch.ones(bn.num_features, dtype=torch.bool))
                for _, bn in bns]
    cfg = model.pruned_cfg([int(m.sum()) for m in masks])
    new = models.build(model.arch, cfg=cfg, empty=True, **model.options)
    SURGERY.get(model.arch, copy_chain_weights)(model, new, cfg_mask)
    new.train(model.training)
    return PruneResult(new, cfg, cfg_mask, threshold, [name for name, _ in bns],
                       [names.get(id(prunable[i]), str(i)) for i in guarded])
