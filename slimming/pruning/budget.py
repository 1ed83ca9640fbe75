"""Pruning to a budget: the fewest channels cut that bring a network's FLOPs (or parameters)
at or under a target, instead of a percent the user would have to guess.

The channels are ranked once (the same global ranking a percent uses); cutting the k lowest
gives a network whose count falls as k grows, so a binary search over k finds the smallest k
that meets the budget, measuring each candidate network for real (``count_flops`` on one image
of the model's input size, or ``count_params``). ``round_to``, ``max_layer_prune`` and
``min_channels`` apply to every candidate, so the budget is met by the network they make.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..errors import SlimmingError, number
from ..measure.stats import count_flops, count_params
from .select import select

_NAME = {"flops": "FLOPs", "params": "parameters"}  # in messages


def parse_budget(value: float, full: int, what: str) -> float:
    """A budget as an absolute count: R in (0, 1) is a fraction of ``full``, R >= 1 a count."""
    number(value, f"target_{what}")
    if not math.isfinite(value) or value <= 0:
        raise SlimmingError(f"target_{what} must be a fraction in (0, 1) or a count, got {value:g}",
                            param=f"target_{what}")
    target = value * full if value < 1 else value
    if target >= full:
        raise SlimmingError(f"target_{what} {value:g} is at or above the unpruned model's "
                            f"{full:.4g} {_NAME[what]}: nothing to cut", param=f"target_{what}")
    return target


def search(model: nn.Module, plan, example: torch.Tensor, target_flops: float | None,
           target_params: float | None, limits: dict):
    """The PruneResult with the fewest channels cut whose FLOPs (``target_flops``) or
    parameters (``target_params``) are at or under the budget; SlimmingError when even the
    smallest network the limits allow is above it. Records the budget in the result."""
    what = "flops" if target_flops is not None else "params"
    size = tuple(example.shape[1:])

    def measure(m: nn.Module) -> int:
        return count_flops(m, size) if what == "flops" else count_params(m)

    full = measure(model)
    target = parse_budget(target_flops if what == "flops" else target_params, full, what)
    total = sum(s.numel() for s in plan.scores)

    def at(k: int):
        masks, threshold, guarded = select(plan.scores, k / total, None, **limits)
        result = plan.build(masks, threshold, guarded)
        return result, measure(result.model)

    lo, hi = 0, total - 1  # k removed channels; k = total - 1 is the most select() allows
    best = at(hi)
    if best[1] > target:
        raise SlimmingError(f"a budget of {target:.4g} {_NAME[what]} cannot be met: the smallest network "
                            f"min_channels, max_layer_prune and round_to allow has {best[1]:.4g}",
                            param=("min_channels", "max_layer_prune", "round_to"))
    while lo < hi:  # the smallest k whose network meets the budget
        mid = (lo + hi) // 2
        result, value = at(mid)
        if value <= target:
            hi, best = mid, (result, value)
        else:
            lo = mid + 1
    result, value = best
    result.budget = {"what": what, "target": target, "achieved": value, "full": full,
                     "percent": hi / total}
    return result
