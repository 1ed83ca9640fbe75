"""Which channels matter: importance criteria for ``slimming.prune`` ("which to cut", apart
from "which go together", ``slimming.graph``, and "how to cut", ``slimming.surgery``).

A criterion is a callable ``(model, group) -> scores``: one non-negative score per channel of
the group (``group.size``), higher meaning more important; the global threshold (or budget)
then cuts the lowest. A new criterion is one class here.

``BNScale`` is network slimming's: |gamma| of the BatchNorm scale factors. A channel of a group
is read by several BatchNorms (every branch of a residual sum, every layer that reads a
concatenated feature), so the group's score combines its members' |gamma|:
- ``max`` (the default): a channel goes only when every BatchNorm that reads it finds it small;
  one member that needs it keeps it. It reduces to |gamma| for a single BatchNorm, so the
  paper's networks rank exactly as in the paper.
- ``mean``: the average over the members, which lets many small members outvote one large one.
- ``sum``: like mean but favours groups with many members (wide residual streams are cut last).
benchmarks/RESULTS.md compares max and mean on real data.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from .graph import Group

Importance = Callable[[nn.Module, Group], torch.Tensor]
REDUCTIONS = ("max", "mean", "sum")


class BNScale:
    """|gamma| of the group's BatchNorms, combined by ``reduce`` (max, mean or sum)."""

    def __init__(self, reduce: str = "max"):
        if reduce not in REDUCTIONS:
            from .errors import SlimmingError

            raise SlimmingError(f"unknown group score {reduce!r}; choose one of: {', '.join(REDUCTIONS)}")
        self.reduce = reduce

    def __call__(self, model: nn.Module, group: Group) -> torch.Tensor:
        per = torch.zeros(len(group.bns), group.size)
        seen = torch.zeros(len(group.bns), group.size, dtype=torch.bool)
        for i, (name, pos, start, length) in enumerate(group.bns):
            weight = model.get_submodule(name).weight
            if weight is None:
                continue
            per[i, start:start + length] = weight.detach()[pos:pos + length].abs().float().cpu()
            seen[i, start:start + length] = True
        if self.reduce == "max":
            return per.amax(0)
        total = per.sum(0)
        return total if self.reduce == "sum" else total / seen.sum(0).clamp_min(1)

    def __repr__(self) -> str:
        return f"BNScale(reduce={self.reduce!r})"


DEFAULT = BNScale("max")
