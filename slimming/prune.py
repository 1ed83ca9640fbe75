"""Pruning: which channels go together, which to cut, and how to cut them.

"Which go together": for the four shipped families, each prunable BatchNorm alone (the
paper's); for any other network, the groups of ``slimming.graph`` (a traced channel graph).
"Which to cut" is architecture-free: one global threshold over the scores of an importance
criterion (``slimming.importance``; network slimming's |gamma| by default).

"How": for any other network, ``slimming.surgery`` cuts a copy along the graph. A family is
rebuilt as ``Net(cfg)`` with the surviving widths (on the meta device) and filled with the kept
weights by its surgery in ``SURGERY``: for chain-shaped networks (NIN, VGG), a walk over the
old and new ``modules()`` side by side with a ``start_mask`` (input channels) and an
``end_mask`` (output channels), as the paper's code does; for the pre-activation ResNet and
DenseNet, whose layers read shared tensors, the family declares per BN which weights its mask
cuts (``channel_slices()``) and ``copy_sliced_weights`` applies exactly that. The traced path
on VGG and NIN gives the same channels and outputs as their surgery (tested): each checks the
other.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn

from .errors import SlimmingError

if TYPE_CHECKING:
    from .importance import Importance


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
    """One boolean keep-mask per prunable BN (in ``prunable_bns`` order), and the threshold,
    by |gamma| (see ``select``). Raises SlimmingError for arguments out of range and for
    gammas that are not finite."""
    bns = prunable_bns(model)
    if not bns or any(bn.weight is None for bn in bns):
        raise SlimmingError("the model has no prunable BatchNorm2d layer with a scale (affine=True): "
                            "there is nothing to slim")
    masks, threshold, _ = select([bn.weight.detach().abs().float().cpu() for bn in bns], percent,
                                 threshold, min_channels)
    return masks, threshold


def select(scores: list[torch.Tensor], percent: float | None, threshold: float | None,
           min_channels: int = 1, round_to: int = 1,
           max_layer_prune: float = 1.0) -> tuple[list[torch.Tensor], float | None, list[int]]:
    """Keep-masks for score vectors (one per group of channels cut together), the threshold,
    and the indices of the groups the ``min_channels`` guard refilled.

    ``percent=p`` ranks all N channels by score and removes exactly ``floor(p * N)`` of them,
    the lowest (ties broken by group order); the returned threshold is the largest score
    removed (None when none is). ``threshold=t`` removes every channel scoring <= t. Then, per
    group of n channels, the best-scoring channels come back until the group keeps at least
    ``min_channels`` (or all n, if it has fewer: no layer is ever emptied), at least
    ``(1 - max_layer_prune) * n`` (rounded up: no layer loses more than that fraction), and a
    multiple of ``round_to`` (never more than n): so these three can only keep more channels
    than the percent or threshold alone.
    """
    if (percent is None) == (threshold is None):
        raise SlimmingError("give exactly one of percent and threshold")
    if percent is not None and not (0 <= percent < 1):
        raise SlimmingError(f"percent must be in [0, 1), got {percent}")
    if threshold is not None and not (0 <= threshold < math.inf):
        raise SlimmingError(f"threshold must be >= 0 and finite, got {threshold}")
    if min_channels < 1:
        raise SlimmingError(f"min_channels must be >= 1, got {min_channels}")
    if not isinstance(round_to, int) or round_to < 1:
        raise SlimmingError(f"round_to must be a positive integer, got {round_to}")
    if not 0 < max_layer_prune <= 1:
        raise SlimmingError(f"max_layer_prune must be in (0, 1], got {max_layer_prune}")
    if not scores:
        raise SlimmingError("no channel group of this model can be pruned (see slimming.graph for "
                            "what keeps a group whole): there is nothing to slim")
    allg = torch.cat(scores)
    if not torch.isfinite(allg).all():
        bad = [i for i, g in enumerate(scores) if not torch.isfinite(g).all()]
        raise SlimmingError(f"{len(bad)} layer(s) have non-finite scores (nan/inf gammas), the "
                            f"first is number {bad[0]} of {len(scores)}: the model diverged; prune a "
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
    masks = list(keep.split([g.numel() for g in scores]))
    guarded = []
    for i, (g, m) in enumerate(zip(scores, masks)):
        n, kept = g.numel(), int(m.sum())
        guard = min(min_channels, n)
        want = max(kept, guard, math.ceil((1 - max_layer_prune) * n - 1e-9))
        want = min(n, -(-want // round_to) * round_to)
        if kept < guard:
            guarded.append(i)
        if want > kept:  # the best channels back, those the cut kept first among them
            order = torch.argsort(g + m.float() * (g.max() + 1), descending=True, stable=True)
            masks[i] = torch.zeros_like(m)
            masks[i][order[:want]] = True
    return masks, threshold, guarded


def _take(t: torch.Tensor, dim: int, mask: torch.Tensor | None) -> torch.Tensor:
    if mask is None:
        return t.detach().clone()
    return t.detach().index_select(dim, mask.nonzero().squeeze(1).to(t.device))


ModuleMasks = dict[str, dict[str, torch.Tensor]]  # conv/linear name -> {"in"/"out": keep-mask}


def copy_chain_weights(old: nn.Module, new: nn.Module, cfg_mask: list[torch.Tensor]) -> ModuleMasks:
    """Fill ``new`` (possibly on the meta device) with the kept weights of ``old``.

    ``cfg_mask`` has one mask per BatchNorm2d of ``old`` in ``modules()`` order. For a chain
    network (conv -> BN -> ... -> linear): a conv keeps input channels ``start_mask`` and output
    channels ``end_mask``; a BN keeps ``end_mask``; a linear keeps input columns ``start_mask``.
    Loading is strict, so a tensor this walk missed is an error, not uninitialised memory.
    Returns each conv's and linear layer's kept input and output channels.
    """
    masks = iter(cfg_mask)
    start_mask, end_mask = None, next(masks, None)
    state, cut = {}, {}
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
            cut[name] = {k: v for k, v in (("in", start_mask), ("out", end_mask)) if v is not None}
        elif isinstance(m0, nn.Linear):
            state[prefix + "weight"] = _take(m0.weight, 1, start_mask)
            if m0.bias is not None:
                state[prefix + "bias"] = m0.bias.detach().clone()
            cut[name] = {"in": start_mask} if start_mask is not None else {}
    new.load_state_dict(state, assign=True)
    return cut


def copy_sliced_weights(old: nn.Module, new: nn.Module, cfg_mask: list[torch.Tensor]) -> ModuleMasks:
    """Fill ``new`` (possibly on the meta device) with the kept weights of ``old``.

    ``old.channel_slices()`` lists, per BatchNorm2d in ``modules()`` order (``cfg_mask``'s
    order), the (state_dict key, dim) pairs whose extent along dim is that BN's channels; each
    is cut to the mask's kept channels (a conv weight may be cut twice: its output channels by
    one BN's mask, its input channels by another's). Every other tensor is copied whole. Strict
    loading turns any tensor the plan left at a wrong shape into an error. Returns each conv's
    and linear layer's kept input and output channels.
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
    layers = {name for name, m in old.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))}
    cut: ModuleMasks = {}
    for slices, mask in zip(plan, cfg_mask):
        for key, dim in slices:
            name = key.rsplit(".", 1)[0]
            if name in layers and key.endswith(".weight") and dim in (0, 1):
                cut.setdefault(name, {})["out" if dim == 0 else "in"] = mask
    return cut


# How each family is cut once the masks are known ("how", apart from "which": channel_masks).
SURGERY: dict[str, Callable[[nn.Module, nn.Module, list[torch.Tensor]], ModuleMasks]] = {
    "nin": copy_chain_weights,
    "vgg": copy_chain_weights,
    "preresnet": copy_sliced_weights,
    "densenet": copy_sliced_weights,
}


@dataclass
class PruneResult:
    """What ``prune`` returns: the smaller network and how it was cut from the original."""

    model: nn.Module
    cfg: list | dict  # a family's widths; for a traced network {BatchNorm name: width}
    cfg_mask: list[torch.Tensor]  # one bool mask per BatchNorm2d of the original, modules() order
    threshold: float | None  # largest score removed (percent) or the threshold given
    layer_names: list[str]  # the original's BatchNorm2d names, in cfg_mask order
    guarded: list[str] = field(default_factory=list)  # BNs the min_channels guard refilled
    masks: dict[str, torch.Tensor] = field(default_factory=dict)  # BN name -> keep-mask
    layers: ModuleMasks = field(default_factory=dict)  # conv/linear name -> {"in"/"out": mask}
    compensation: dict = field(default_factory=dict)  # what slimming.repair.compensate folded
    budget: dict = field(default_factory=dict)  # target_flops/params: what, target, achieved

    def __post_init__(self):
        if not self.masks:
            self.masks = dict(zip(self.layer_names, self.cfg_mask))

    def layer_table(self) -> list[tuple[str, int, int]]:
        """(BN layer name, channels before, channels after) for every BatchNorm2d."""
        return [(n, m.numel(), int(m.sum())) for n, m in zip(self.layer_names, self.cfg_mask)]


def default_example(model: nn.Module) -> torch.Tensor:
    """One image of the size the model takes: its ``input_size`` (C, H, W) when it has one
    (set by slimming's builders), 3x32x32 for the shipped families, else 3x224x224."""
    size = getattr(model, "input_size", None) or ((3, 32, 32) if getattr(model, "arch", None) in SURGERY
                                                  else (3, 224, 224))
    return torch.zeros(1, *size, device=next(model.parameters()).device)


def prune(model: nn.Module, percent: float | None = None, threshold: float | None = None,
          min_channels: int = 1, *, importance: Importance | None = None,
          example_inputs: torch.Tensor | None = None, ignore: tuple[str, ...] = (),
          surgery: str = "auto", target_flops: float | None = None,
          target_params: float | None = None, round_to: int = 1, max_layer_prune: float = 1.0,
          compensate: bool = True) -> PruneResult:
    """Slim ``model``: cut its least important channels and build it thinner.

    How many channels go, one of:
    - ``percent``: a fraction of the prunable channels, exactly ``floor(percent * N)``;
    - ``threshold``: every channel scoring at or under it;
    - ``target_flops`` / ``target_params``: a budget, a fraction in (0, 1) of the unpruned
      model's count or an absolute count (``2.5e8``): the fewest channels cut that bring the
      network at or under it (``slimming.budget``).
    Then ``min_channels``, ``max_layer_prune`` (the largest fraction any layer loses) and
    ``round_to`` (every width a multiple of it, never above the original) may keep more.

    ``importance`` scores channels (default ``slimming.importance.BNScale("max")``: |gamma|, the
    largest over a group's BatchNorms). A shipped family (NIN, VGG, pre-activation ResNet,
    DenseNet) is cut by its own surgery, as the paper does; any other network (or any, with
    ``surgery="graph"``) is traced on ``example_inputs`` (default: one image of
    ``default_example``'s size) and cut along its channel graph, keeping whole the modules in
    ``ignore``. ``compensate`` (default) folds the constant output a cut channel still had
    (its activation of beta) into the layers that read it (``slimming.repair``); False gives
    the paper's network exactly. The original model is left untouched; the new one is on the
    same device and in the same train/eval mode.
    """
    from . import budget, repair
    from .importance import DEFAULT

    model = unwrap(model)
    importance = importance or DEFAULT
    if surgery not in ("auto", "graph"):
        raise SlimmingError(f"surgery must be 'auto' or 'graph', got {surgery!r}")
    how = [percent is not None, threshold is not None, target_flops is not None,
           target_params is not None]
    if sum(how) != 1:
        raise SlimmingError("give exactly one of percent, threshold, target_flops and target_params")
    example = default_example(model) if example_inputs is None else example_inputs
    if surgery == "graph" or getattr(model, "arch", None) not in SURGERY:
        plan = _traced_plan(model, importance, example, ignore)
    else:
        plan = _family_plan(model, importance)
    limits = dict(min_channels=min_channels, round_to=round_to, max_layer_prune=max_layer_prune)
    if target_flops is not None or target_params is not None:
        result = budget.search(model, plan, example, target_flops, target_params, limits)
    else:
        masks, threshold, guarded = select(plan.scores, percent, threshold, **limits)
        result = plan.build(masks, threshold, guarded)
    if compensate:
        result.compensation = repair.compensate(model, result, example)
    return result


def _bn_names(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(name, bn) for name, bn in model.named_modules() if isinstance(bn, nn.BatchNorm2d)]


@dataclass
class Plan:
    """A model's channel groups, scored (``scores``, one vector per group), and ``build``: the
    pruned network for keep-masks of those groups (with the threshold and the guarded groups'
    indices, which it only records)."""

    scores: list[torch.Tensor]
    build: Callable[[list[torch.Tensor], float | None, list[int]], PruneResult]


def _family_plan(model: nn.Module, importance: Importance) -> Plan:
    """The paper's way: one group per prunable BN, rebuilt as ``Net(cfg)`` on the meta device."""
    from . import models  # here, not at import time: the pruning core works on any Net-like model
    from .graph import Group

    prunable = prunable_bns(model)
    if not prunable or any(bn.weight is None for bn in prunable):
        raise SlimmingError("the model has no prunable BatchNorm2d layer with a scale (affine=True): "
                            "there is nothing to slim")
    bns = _bn_names(model)
    names = {id(bn): name for name, bn in model.named_modules()}
    scores = [importance(model, Group(bn.num_features, [], [(names[id(bn)], 0, 0, bn.num_features)]))
              for bn in prunable]

    def build(masks, threshold, guarded) -> PruneResult:
        by_layer = {id(bn): m for bn, m in zip(prunable, masks)}
        cfg_mask = [by_layer.get(id(bn), torch.ones(bn.num_features, dtype=torch.bool)) for _, bn in bns]
        cfg = model.pruned_cfg([int(m.sum()) for m in masks])
        new = models.build(model.arch, cfg=cfg, empty=True, **model.options)
        layers = SURGERY[model.arch](model, new, cfg_mask)
        new.train(model.training)
        return PruneResult(new, cfg, cfg_mask, threshold, [name for name, _ in bns],
                           [names[id(prunable[i])] for i in guarded], layers=layers)

    return Plan(scores, build)


def _traced_plan(model: nn.Module, importance: Importance, example: torch.Tensor, ignore) -> Plan:
    """Any network: trace its channel graph once, score each prunable group; ``build`` cuts a
    copy along the graph."""
    from . import surgery
    from .graph import trace

    if not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        raise SlimmingError("the model has no BatchNorm layer: there is nothing to slim (network "
                            "slimming scores channels by their BatchNorm scale factors)")
    graph = trace(model, example, tuple(ignore))
    groups = [g for g in graph.groups() if g.prunable]
    bns = _bn_names(model)

    def build(masks, threshold, guarded) -> PruneResult:
        roots = {graph.find(g.spaces[0]): m for g, m in zip(groups, masks)}
        plan = surgery.plan(graph, roots)
        new = surgery.cut(model, plan)
        cfg_mask = [plan.get(name, {}).get("channels", torch.ones(bn.num_features, dtype=torch.bool))
                    for name, bn in bns]
        cfg = {name: int(m.sum()) for (name, _), m in zip(bns, cfg_mask)}
        new.cfg = cfg
        layers = {name: {k: v for k, v in m.items() if k in ("in", "out")} for name, m in plan.items()
                  if isinstance(model.get_submodule(name), (nn.Conv2d, nn.Linear))}
        return PruneResult(new, cfg, cfg_mask, threshold, [name for name, _ in bns],
                           [groups[i].bns[0][0] for i in guarded], layers=layers)

    return Plan([importance(model, g).float().cpu() for g in groups], build)
