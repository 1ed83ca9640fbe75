"""The plans a prune cuts by: a model's channel groups, scored, and how to build the pruned
network for keep-masks of them (``Plan``).

``family_plan``: the paper's way, one group per prunable BatchNorm of a registered family,
rebuilt as ``Net(cfg)`` and filled by the family's surgery (``surgery.SURGERY``).
``traced_plan``: any network, its channel graph traced once (``trace``), the free channels of
each prunable group scored; ``build`` puts the pinned channels back, evens out the equal-count
blocks and cuts a copy along the graph (``surgery``). ``as_family`` gives a shipped family cut
along its graph its own cfg where ``Net(cfg)`` rebuilds the same network; ``nothing_to_cut``
says why no channel can go.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from .. import models
from ..errors import SlimmingError
from ..layers.attention import thinned
from ..layers.baked import baked_layers
from ..layers.gates import ATTR as GATE
from ..layers.gates import fold
from ..layers.rules import ChannelGate, factor_width, is_factor_layer
from . import branches, surgery
from .graph import UNSCORED, Factor, GraphError, Group, ignored_names
from .importance import Importance
from .records import PruneResult
from .select import equalize, scaled_prunable_bns, whole_block_scores
from .trace import as_inputs, trace


def _bn_names(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(name, bn) for name, bn in model.named_modules()
            if isinstance(bn, nn.modules.batchnorm._BatchNorm)]


@dataclass
class Plan:
    """A model's channel groups, scored (``scores``, one vector per group), and ``build``: the
    pruned network for keep-masks of those groups (with the threshold and the guarded groups'
    indices, which it only records)."""

    scores: list[torch.Tensor]
    build: Callable[[list[torch.Tensor], float | None, list[int]], PruneResult]
    sized: list[str] = field(default_factory=list)  # modules whose block or split sizes were followed
    # a traced plan's per-module keep-masks for group masks, without building (``surgery.plan``):
    # what a latency budget's probe reads widths off
    cuts: Callable[[list[torch.Tensor]], dict] | None = None
    # gate positions (a head's, a channel's: ``add_gates``) the graph keeps whatever they score,
    # each (gate layer, position, why): a gate trained to zero there is kept, and ``prune`` says so
    held: list[tuple[str, int, str]] = field(default_factory=list)
    # the groups that may be cut whole, a residual branch's widths (``branches``): index -> the
    # modules that make, carry or read them
    removable: dict[int, set[str]] = field(default_factory=dict)


def family_plan(model: nn.Module, importance: Importance) -> Plan:
    """The paper's way: one group per prunable BN, rebuilt as ``Net(cfg)`` on the meta device."""
    prunable = scaled_prunable_bns(model)
    bns = _bn_names(model)
    names = {id(bn): name for name, bn in model.named_modules()}
    scores = [scores_of(importance, model,
                        Group(bn.num_features, [], [Factor(names[id(bn)], 0, 0, bn.num_features)]))
              for bn in prunable]

    def build(masks, threshold, guarded) -> PruneResult:
        by_layer = {id(bn): m for bn, m in zip(prunable, masks)}
        cfg_mask = [by_layer.get(id(bn), torch.ones(bn.num_features, dtype=torch.bool)) for _, bn in bns]
        cfg = model.pruned_cfg([int(m.sum()) for m in masks])
        new = models.build(model.arch, cfg=cfg, empty=True, **model.options)
        layers = surgery.SURGERY[models.family(model.arch).surgery](model, new, cfg_mask)
        new.train(model.training)
        return PruneResult(new, cfg, cfg_mask, threshold, [name for name, _ in bns],
                           [names[id(prunable[i])] for i in guarded], layers=layers,
                           ranked=(sum(len(m) for m in masks), sum(int((~m).sum()) for m in masks)))

    return Plan(scores, build)


def as_family(model: nn.Module, result: PruneResult) -> None:
    """A shipped family cut along its traced graph (``surgery="graph"``, ``ignore=``): its cfg
    in the family's own form, where ``Net(cfg)`` rebuilds exactly the network the cut made (VGG,
    NIN), so that its checkpoint loads as the family's; else the per-BatchNorm dict stays."""
    prunable = {id(bn) for bn in scaled_prunable_bns(model)}
    widths = [int(result.masks[name].sum()) for name, bn in _bn_names(model) if id(bn) in prunable]
    try:
        cfg = model.pruned_cfg(widths)
        built = models.build(model.arch, cfg=cfg, empty=True, **model.options)
    except Exception:  # noqa: BLE001 (a cut the family's cfg cannot say)
        return
    mine = {k: v.shape for k, v in result.model.state_dict().items()}
    if mine == {k: v.shape for k, v in built.state_dict().items()}:
        result.cfg = result.model.cfg = cfg


def traced_plan(model: nn.Module, importance: Importance, example, ignore, keep_whole=(),
                 follow_sizes: bool = False, output_transform=None, refused=(), more_inputs=()) -> Plan:
    """Any network: trace its channel graph once, score the free channels of each prunable
    group; ``build`` puts the pinned channels back, evens out the equal-count blocks (grouped
    convolutions, chunks) and cuts a copy along the graph."""
    factors = [(name, m) for name, m in model.named_modules() if is_factor_layer(m)]
    if not factors:
        raise SlimmingError("the model has no BatchNorm, GroupNorm, LayerNorm or affine InstanceNorm: there "
                            "is nothing to slim (network slimming scores channels by their scaling "
                            f"factors); {GATES_HINT}")
    traced = trace(model, example, ignore, keep_whole, follow_sizes, output_transform, refused, more_inputs)
    graph, computed = traced.graph, traced.baked.computed
    stuck = [n for n in traced.baked.unbaked
             if isinstance(model.get_submodule(n)._modules.get(GATE), ChannelGate)]
    if stuck:  # folded after the check, the gate would scale columns its layer standardises again
        raise GraphError(f"{stuck[0]} computes its weight and does more than convolve with it: a gate there "
                         "cannot be folded in; remove it (add_gates puts none there)")
    kept_whole = ignored_names(model, ignore)  # their integer attributes are theirs too
    everything = graph.groups()
    groups = [g for g in everything if g.prunable]
    if not groups:
        raise GraphError(nothing_to_cut(model, everything))
    scores = [scores_of(importance, model, g) for g in groups]
    blocks = graph.blocks()
    whole_block_scores({graph.find(g.spaces[0]): s for g, s in zip(groups, scores)}, blocks)

    def roots_of(masks) -> dict:
        """The keep-mask of every space's root: the groups' free channels as ``masks`` say, the
        pinned ones kept, the equal-count blocks evened out."""
        roots = {graph.find(g.spaces[0]): torch.ones(g.size, dtype=torch.bool) for g in everything}
        ranks = {r: torch.full((len(m),), float("inf")) for r, m in roots.items()}
        for g, m, score in zip(groups, masks, scores):
            r, free = graph.find(g.spaces[0]), g.free()
            roots[r][free] = m
            ranks[r][free] = score[free]
        equalize(roots, ranks, blocks)
        return roots

    def build(masks, threshold, guarded) -> PruneResult:
        roots = roots_of(masks)
        plan = surgery.plan(graph, roots)
        new = surgery.cut(model, plan, traced)
        fold(new, set(traced.coverage.by_weight), multiply=False)  # gates whose layer's hooks never run
        widths = surgery.update_widths(new, traced, roots, skip=kept_whole)
        removed = branches.remove(new, plan, graph)  # the layers a branch cut whole leaves
        thinned(new)  # torch's MultiheadAttention whose widths the cut changed: run as slimming's
        if removed:  # and those only they read
            removed = branches.unread(new, as_inputs(example), removed)
        cfg_mask = [plan.get(name, {}).get("channels", torch.ones(factor_width(m), dtype=torch.bool))
                    for name, m in factors]
        # a norm only emptied layers read is emptied too: no channels; gates fold away at the end
        cfg = {name: 0 if removed.get(name) == "Emptied" else int(k.sum())
               for (name, m), k in zip(factors, cfg_mask) if not isinstance(m, ChannelGate)}
        new.cfg = cfg
        layers = {name: {k: v for k, v in m.items() if k in ("in", "out")} for name, m in plan.items()
                  if isinstance(model.get_submodule(name), (nn.Conv2d, nn.Linear))}
        ranked = (sum(int(g.free().sum()) for g in groups),
                  sum(int((~roots[graph.find(g.spaces[0])][g.free()]).sum()) for g in groups))
        result = PruneResult(new, cfg, cfg_mask, threshold, [name for name, _ in factors],
                             [groups[i].bns[0].layer for i in guarded], layers=layers, widths=widths,
                             ranked=ranked, value_reads=sorted(set(traced.coverage.value_reads)),
                             baked={n: computed[n] for n in baked_layers(new) if n in computed},
                             removed=removed)
        result.masks.update({n: plan[n]["out"] for n in traced.conditioning if "out" in plan.get(n, {})})
        return result

    return Plan([s[g.free()] for g, s in zip(groups, scores)], build, sorted(set(traced.widths.sized)),
                lambda masks: surgery.plan(graph, roots_of(masks)), held_gates(model, everything),
                branches.removable(graph, groups))


def held_gates(model: nn.Module, groups: list[Group]) -> list[tuple[str, int, str]]:
    """Every gate position (``ChannelGate``, ``HeadGate``) of ``groups`` the graph keeps, as
    (gate layer, position, the group's first reason)."""
    held = []
    for g in groups:
        kept = torch.ones(g.size, dtype=torch.bool) if not g.prunable else ~g.free()
        for f in g.bns:
            gate = isinstance(model.get_submodule(f.layer), ChannelGate)
            if gate and kept[f.start:f.start + f.count].any():
                why = g.reason or (g.reasons[0] if g.reasons else "kept")
                held += [(f.layer, f.pos + i, why) for i in range(f.count) if kept[f.start + i]]
    return held


def nothing_to_cut(model: nn.Module, groups: list[Group]) -> str:
    """Why no channel of ``model`` can be cut: the reasons that kept its scored groups whole,
    the most common first."""
    counts: dict[str, int] = {}
    for g in groups:
        if g.bns:
            for why in g.reasons[:1]:
                counts[why] = counts.get(why, 0) + g.size
    reasons = sorted(counts, key=lambda w: -counts[w])
    said = "; ".join(f"{w} ({counts[w]} channels)" for w in reasons[:3]) \
        or "no scaling factor scores any channel"
    hint = f"; {GATES_HINT}" if not reasons or str(reasons[0]) == UNSCORED else ""
    return f"no channel of {type(model).__name__} can be cut: {said}{hint}"


# where nothing scores the channels (no normalisation, an InstanceNorm without affine)
GATES_HINT = "slimming.add_gates(model, example, everywhere=True) gives them gates to train and cut"


def scores_of(importance, model: nn.Module, group: Group) -> torch.Tensor:
    """The criterion's scores for ``group``, checked: a 1-D real tensor, one score per channel
    (``select`` then refuses scores that are not finite)."""
    s = importance(model, group)
    if not isinstance(s, torch.Tensor) or s.dim() != 1 or len(s) != group.size or s.is_complex():
        got = f"a tensor of shape {tuple(s.shape)}" if isinstance(s, torch.Tensor) else type(s).__name__
        raise SlimmingError(f"importance {importance!r} gave {got} for a group of {group.size} channels; "
                            f"it must give one score per channel (a 1-D tensor of {group.size})",
                            param="importance")
    return s.detach().float().cpu().clone()  # its own memory: whole_block_scores writes in it
