"""What ``prune`` says of a cut it made, each a warning or None: a model without the sparsity
the cut assumes (``little_sparsity``), gates trained off that the graph keeps (``gates_held``),
a wide layer nearly emptied (``nearly_emptied``)."""

from __future__ import annotations

import torch
from torch import nn

from ..errors import listed
from ..layers.rules import HeadGate
from .records import PruneResult
from .select import SPARSE_BOUND


def little_sparsity(model: nn.Module, result: PruneResult) -> str | None:
    """What to say when the cut takes far more channels than sparsity training left near zero
    (fewer than half as many |gamma| under ``SPARSE_BOUND`` as channels cut): the cut then takes
    channels that still matter."""
    names = [n for n, m in zip(result.layer_names, result.cfg_mask) if len(m)]
    gammas = [w.detach().abs().float().flatten().cpu() for n in names
              if (w := getattr(model.get_submodule(n), "weight", None)) is not None]
    if not gammas:
        return None
    gammas = torch.cat(gammas)
    near_zero = (gammas < SPARSE_BOUND).float().mean().item()
    total = sum(b for _, b, _ in result.layer_table())
    cut = sum(b - a for _, b, a in result.layer_table()) / max(total, 1)
    if near_zero >= cut / 2:
        return None
    return (f"only {100 * near_zero:.1f}% of the |gamma| (scaling factors) are under {SPARSE_BOUND:g} but "
            f"{100 * cut:.1f}% of the channels are cut: the model shows little sparsity, so this cuts "
            "channels that still matter; sparsity training comes first (slimming.Sparsity, or slimming "
            "train --sparsity S, or --sparsity-target F to have S chosen)")


def gates_held(model: nn.Module, plan, result: PruneResult) -> str | None:
    """What to say when gates trained to about zero (under ``SPARSE_BOUND``: a head's gate the
    user trained off) are kept because the graph holds their channels (``Plan.held``), where
    the cut removes anything: otherwise the heads would stay in silence."""
    if result.threshold is None:
        return None
    low = [(name, i, why) for name, i, why in plan.held
           if abs(float(model.get_submodule(name).weight.detach().flatten()[i])) < SPARSE_BOUND]
    if not low:
        return None
    names = sorted({name for name, _, _ in low})
    kind = "head" if all(isinstance(model.get_submodule(n), HeadGate) for n in names) else "channel"
    return (f"{len(low)} {kind}(s) whose gate is under {SPARSE_BOUND:g} are kept, since the graph keeps "
            f"their channels: {listed(names)} ({low[0][2]})")


def nearly_emptied(result: PruneResult, share: float = 0.05, wide: int = 20) -> str | None:
    """What to say when the cut leaves a wide layer (``wide`` channels or more) under ``share``
    of its channels: the network may be near chance right after the cut. A layer of a branch
    removed whole (none kept, ``result.removed``) is no such layer: the stream goes around it."""
    thin = [(n, b, a) for n, b, a in result.layer_table() if b >= wide and a < share * b
            and not (a == 0 and n in result.removed)]
    if not thin:
        return None
    n, b, a = min(thin, key=lambda t: t[2] / t[1])
    return (f"{len(thin)} layer(s) keep under {share:.0%} of their channels ({n} keeps {a} of "
            f"{b}): the network may be near chance until it is fine-tuned; max_layer_prune "
            "(--max-layer-prune) caps what one layer loses")
