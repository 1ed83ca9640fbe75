"""Which channels to cut: keep-masks from channel scores by one global threshold (a percent of
all channels, or a threshold), with per-layer limits that can only keep more (``min_channels``,
``max_layer_prune``, ``round_to``)."""

from __future__ import annotations

import math

import torch
from torch import nn

from ..errors import SlimmingError, number
from ..layers.rules import is_factor_layer
from ..utils.modules import unwrap

SPARSE_BOUND = 1e-2  # |gamma| under this counts as "pruned away by sparsity training"


def scaled_prunable_bns(model: nn.Module) -> list[nn.BatchNorm2d]:
    """``prunable_bns(model)``, each with a scale to rank channels by; SlimmingError if there is
    none (or one without: affine=False)."""
    bns = prunable_bns(model)
    if not bns or any(bn.weight is None for bn in bns):
        raise SlimmingError("the model has no prunable BatchNorm2d layer with a scale (affine=True): "
                            "there is nothing to slim")
    return bns


def prunable_bns(model: nn.Module) -> list[nn.BatchNorm2d]:
    """The BatchNorm layers whose channels may be cut: the model's own list, else every BN2d
    (SyncBatchNorm included)."""
    model = unwrap(model)
    if hasattr(model, "prunable_bns"):
        return model.prunable_bns()
    return [m for m in model.modules() if isinstance(m, (nn.BatchNorm2d, nn.SyncBatchNorm))]


def prunable_factors(model: nn.Module) -> list[nn.Module]:
    """The layers whose per-channel scale (``weight``) network slimming ranks and ``Sparsity``
    trains toward zero: a family's own ``prunable_bns()``; else every BatchNorm (1-D, 2-D, 3-D,
    SyncBatchNorm) and GroupNorm with a scale (``slimming.layers.rules.is_factor_layer``)."""
    model = unwrap(model)
    if hasattr(model, "prunable_bns"):
        return model.prunable_bns()
    return [m for m in model.modules() if is_factor_layer(m) and getattr(m, "weight", None) is not None]


def channel_masks(model: nn.Module, percent: float | None = None, threshold: float | None = None,
                  min_channels: int = 1) -> tuple[list[torch.Tensor], float | None]:
    """One boolean keep-mask per prunable BN (in ``prunable_bns`` order), and the threshold,
    by |gamma| (see ``select``). Raises SlimmingError for arguments out of range and for
    gammas that are not finite."""
    bns = scaled_prunable_bns(model)
    masks, threshold, _ = select([bn.weight.detach().abs().float().cpu() for bn in bns], percent,
                                 threshold, min_channels)
    return masks, threshold


def select(scores: list[torch.Tensor], percent: float | None, threshold: float | None,
           min_channels: int = 1, round_to: int | list[list[int]] = 1,
           max_layer_prune: float = 1.0,
           removable=()) -> tuple[list[torch.Tensor], float | None, list[int]]:
    """Keep-masks for score vectors (one per group of channels cut together), the threshold,
    and the indices of the groups the ``min_channels`` guard refilled.

    ``percent=p`` ranks all N channels by score and removes exactly ``floor(p * N)`` of them,
    the lowest (ties broken by group order); the returned threshold is the largest score
    removed (None when none is). ``threshold=t`` removes every channel scoring <= t. Then, per
    group of n channels, the best-scoring channels come back until the group keeps at least
    ``min_channels`` (or all n, if it has fewer: no layer is ever emptied), at least
    ``(1 - max_layer_prune) * n`` (rounded up: no layer loses more than that fraction), and a
    multiple of ``round_to`` (never more than n; a list: per group, the widths it may keep,
    ascending, as ``round_to="auto"`` measures them): so these three can only keep more
    channels than the percent or threshold alone. ``removable``: the indices of groups that
    ``min_channels`` does not guard, which may be cut whole (``slimming.pruning.branches``: a
    residual branch's width); the other two limits still apply to them.
    """
    steps = round_to if isinstance(round_to, list) else None
    round_to = 1 if steps is not None else round_to
    _check_limits(percent, threshold, min_channels, round_to, max_layer_prune)
    if not scores:
        raise SlimmingError("no channel group of this model can be pruned (see slimming.pruning.graph for "
                            "what keeps a group whole): there is nothing to slim")
    keep, threshold = _ranked(torch.cat(scores), scores, percent, threshold)
    masks = list(keep.split([g.numel() for g in scores]))
    guarded = []
    for i, (g, m) in enumerate(zip(scores, masks)):
        n, kept = g.numel(), int(m.sum())
        guard = 0 if i in removable else min(min_channels, n)
        want = max(kept, guard, math.ceil((1 - max_layer_prune) * n - 1e-9))
        want = min(n, -(-want // round_to) * round_to)
        if steps is not None:
            want = next((w for w in steps[i] if w >= want), n)
        if kept < guard:
            guarded.append(i)
        if want > kept:  # the best channels back, those the cut kept first among them
            order = torch.argsort(g + m.float() * (g.max() + 1), descending=True, stable=True)
            masks[i] = torch.zeros_like(m)
            masks[i][order[:want]] = True
    return masks, threshold, guarded


def _check_limits(percent, threshold, min_channels, round_to, max_layer_prune) -> None:
    """One line for each value ``select`` cannot take (a number at all, then its range)."""
    if (percent is None) == (threshold is None):
        raise SlimmingError("give exactly one of percent and threshold", param=("percent", "threshold"))
    for value, name in ((percent, "percent"), (threshold, "threshold"), (max_layer_prune, "max_layer_prune")):
        if value is not None:
            number(value, name)  # a number at all ("0.5", True, nan are not): the ranges below
    for value, name in ((min_channels, "min_channels"), (round_to, "round_to")):
        number(value, name, integer=True, low=1)
    if percent is not None and not (0 <= percent < 1):
        raise SlimmingError(f"percent must be in [0, 1), got {percent}", param="percent")
    if threshold is not None and not (0 <= threshold < math.inf):
        raise SlimmingError(f"threshold must be >= 0 and finite, got {threshold}", param="threshold")
    if min_channels < 1:
        raise SlimmingError(f"min_channels must be >= 1, got {min_channels}", param="min_channels")
    if not isinstance(round_to, int) or round_to < 1:
        raise SlimmingError(f"round_to must be a positive integer, got {round_to}", param="round_to")
    if not 0 < max_layer_prune <= 1:
        raise SlimmingError(f"max_layer_prune must be in (0, 1], got {max_layer_prune}",
                            param="max_layer_prune")


def _ranked(allg: torch.Tensor, scores: list[torch.Tensor], percent,
            threshold) -> tuple[torch.Tensor, float | None]:
    """The keep-mask over all channels, by the lowest ``floor(percent * N)`` or by ``threshold``,
    and the threshold that gives it."""
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
        return keep, allg[order[k - 1]].item() if k else None
    keep = allg > threshold
    if not keep.any():
        raise SlimmingError(f"threshold {threshold:g} is at or above every |gamma| (the largest "
                            f"is {allg.max().item():.4g}): it would prune every channel")
    return keep, threshold


def whole_block_scores(scores: dict[int, torch.Tensor], constraints) -> None:
    """In place: every channel of a block that is kept or cut whole (``"whole"``: a GroupNorm's
    groups; blocks of (group, start, length) runs, ``scores`` by group) scores its block's mean,
    so that the global ranking takes or leaves whole groups and a percent is met to within one
    group (``equalize`` then rounds the one group left split)."""
    for kind, blocks in constraints:
        if kind != "whole":
            continue
        for block in blocks:
            runs = [(r, s, n) for r, s, n in block if r in scores]
            if runs:
                mean = torch.cat([scores[r][s:s + n] for r, s, n in runs]).mean()
                for r, s, n in runs:
                    scores[r][s:s + n] = mean


def equalize(masks: dict[int, torch.Tensor], scores: dict[int, torch.Tensor], constraints) -> None:
    """In place: in every constraint ((kind, blocks): blocks of equal length, each a list of
    (group, start, length) runs), every block keeps the same number of channels, its
    best-scoring ones (``scores``: +inf where a channel must stay). First each constraint on its
    own. The pieces of a chunk ("chunk", 2 to 4 of them) keep as many as the piece that keeps
    most: like the other limits this only keeps more, and costs little. The groups of a grouped
    convolution ("groups", often 30 to 100) keep the mean of their counts, rounded up: their
    counts scatter around it, and the most any keeps would keep nearly everything; the total
    never falls (the threshold decided how many go, the groups decide where from). Then, where
    constraints share channels, blocks that keep fewer get their best channels back until each
    keeps as many as the one that keeps most. The groups of a GroupNorm ("whole") keep as
    many whole groups as the channels kept in them fill, rounded up, those of the best mean
    score; then any group with a channel kept by another constraint is kept whole. A grouped
    convolution stays one with equal groups, the chunks of a tensor stay the chunks of the
    pruned tensor, a GroupNorm keeps whole groups."""
    if not constraints:
        return
    start, offset = {}, 0
    for r, m in masks.items():
        start[r], offset = offset, offset + len(m)
    keep = torch.cat(list(masks.values()))
    rank = torch.cat([scores[r].float() for r in masks])
    index = [torch.stack([torch.cat([torch.arange(start[r] + s, start[r] + s + n) for r, s, n in block])
                          for block in blocks]) for _, blocks in constraints]  # (blocks, length) each

    def keep_best(idx: torch.Tensor, k: int, by: torch.Tensor) -> None:
        new = torch.zeros(idx.shape, dtype=torch.bool)
        new.scatter_(1, torch.argsort(by, dim=1, descending=True, stable=True)[:, :k], True)
        keep[idx] = new

    whole = [idx for (kind, _), idx in zip(constraints, index) if kind == "whole"]
    equal = [(kind, idx) for (kind, _), idx in zip(constraints, index) if kind != "whole"]
    emptied = {r for r, m in masks.items() if not bool(m.any())}  # removable groups cut whole
    # a constraint over emptied groups alone keeps none; any other, at least one per block
    least = [int(not all(r in emptied for block in blocks for r, _, _ in block)) for _, blocks in constraints]
    whole_least = [n for (kind, _), n in zip(constraints, least) if kind == "whole"]
    equal_least = [n for (kind, _), n in zip(constraints, least) if kind != "whole"]
    for idx, low in zip(whole, whole_least):  # as many whole blocks as the kept channels fill, the best
        forced = torch.isinf(rank[idx]).any(1)
        count = max(low, int(forced.sum()), -(-int(keep[idx].sum()) // idx.shape[1]))
        order = torch.argsort(torch.where(forced, torch.inf, rank[idx].mean(1)), descending=True, stable=True)
        chosen = torch.zeros(len(idx), dtype=torch.bool)
        chosen[order[:count]] = True
        keep[idx] = chosen[:, None].expand_as(idx)
    for (kind, idx), low in zip(equal, equal_least):
        counts = keep[idx].sum(1)
        fixed = int(torch.isinf(rank[idx]).sum(1).max())
        share = int(counts.max()) if kind == "chunk" else -(-int(counts.sum()) // len(idx))
        keep_best(idx, max(low, fixed, share), rank[idx] + keep[idx] * (kind == "chunk") * 1e30)
    for _ in range(100):
        for idx in whole:  # a block with one channel kept keeps them all
            keep[idx] = keep[idx].any(1, keepdim=True).expand_as(idx)
        short = [idx for _, idx in equal if bool((keep[idx].sum(1) < keep[idx].sum(1).max()).any())]
        if not short:
            break
        for idx in short:  # what each block keeps now first, then its best
            keep_best(idx, int(keep[idx].sum(1).max()), rank[idx] + keep[idx] * 1e30)
    else:  # constraints that read the same channels twice: keep all they touch
        for idx in index:
            keep[idx] = True
    for r, m in masks.items():
        m.copy_(keep[start[r]:start[r] + len(m)])
