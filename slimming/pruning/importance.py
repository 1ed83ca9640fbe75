"""Which channels matter: importance criteria for ``slimming.prune`` ("which to cut", apart
from "which go together", ``slimming.pruning.graph``, and "how to cut", ``slimming.pruning.surgery``).

A criterion is an ``Importance``: called as ``(model, group) -> scores``, one non-negative score
per channel of the group (``group.size``), higher meaning more important; the global threshold
(or budget) then cuts the lowest. A new criterion is one subclass (in this file or the user's
own): its ``names`` register it, so ``get_importance(NAME)`` and ``--importance NAME`` find it.

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

import torch
from torch import nn

from ..errors import SlimmingError, clip
from .graph import Group

REDUCTIONS = ("max", "mean", "sum")
CRITERIA: dict[str, tuple[type, dict]] = {}  # name -> (class, its keyword arguments)


class Importance:
    """A criterion: ``__call__(model, group)`` gives one score per channel of ``group``.
    ``names``: {name: keyword arguments} under which a subclass registers itself."""

    names: dict[str, dict] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name, options in cls.__dict__.get("names", {}).items():
            taken = CRITERIA.get(name, (cls,))[0]
            if (taken.__module__, taken.__qualname__) != (cls.__module__, cls.__qualname__):
                raise ValueError(f"the importance name {name!r} is taken by {taken.__name__}")
            CRITERIA[name] = (cls, options)  # the same class defined again replaces itself

    def __call__(self, model: nn.Module, group: Group) -> torch.Tensor:
        raise NotImplementedError


def get_importance(name: str) -> Importance:
    """The criterion registered as ``name`` (``bn-max``, ``bn-mean``, ``bn-sum``, ...)."""
    if name not in CRITERIA:
        raise SlimmingError(f"importance {clip(name)} is not a criterion; choose one of: "
                            f"{', '.join(sorted(CRITERIA))}", param="importance")
    cls, options = CRITERIA[name]
    return cls(**options)


class BNScale(Importance):
    """|gamma| of the group's BatchNorms, combined by ``reduce`` (max, mean or sum)."""

    names = {f"bn-{r}": {"reduce": r} for r in REDUCTIONS}

    def __init__(self, reduce: str = "max"):
        if reduce not in REDUCTIONS:
            raise SlimmingError(f"unknown group score {reduce!r}; choose one of: {', '.join(REDUCTIONS)}",
                                param="reduce")
        self.reduce = reduce

    def __call__(self, model: nn.Module, group: Group) -> torch.Tensor:
        per = torch.zeros(len(group.bns), group.size)
        seen = torch.zeros(len(group.bns), group.size, dtype=torch.bool)
        for i, (name, pos, start, length) in enumerate(group.bns):  # Factor runs
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
