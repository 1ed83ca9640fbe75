"""Pruning to a budget: the fewest channels cut that bring a network's FLOPs (or parameters)
at or under a target, instead of a percent the user would have to guess.

The channels are ranked once (the same global ranking a percent uses); cutting the k lowest
gives a network whose count falls as k grows, so a binary search over k finds the smallest k
that meets the budget, measuring each candidate network for real (``count_flops`` on one image
of the model's input size, or ``count_params``). ``round_to``, ``max_layer_prune`` and
``min_channels`` apply to every candidate, so the budget is met by the network they make.
Every candidate is measured through ``measured``, which runs it as ``prune`` will return it
(a latency measure too goes through it): a cut whose forward fails is the check's to refuse,
not a raw error.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from ..errors import BudgetError, SlimmingError, first_line, number
from ..measure.stats import count_flops, count_params
from ..utils import progress
from ..utils.modules import modes_kept
from .graph import GraphError
from .records import CountBudget
from .select import select
from .trace import as_inputs

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


def measured(result, measure: Callable[[nn.Module], float]) -> float:
    """``measure(result.model)`` of a candidate cut (its FLOPs, its latency), with the integer
    widths as ``prune`` will return them; GraphError where its forward fails either way.

    Why: the cut sets integer attributes the forward reads (``result.widths``: a C2f's ``c``,
    an attention's ``key_dim``), and some it reads as fixed sizes, so a candidate as built may
    not run at all (YOLO11's C2PSA, its heads cut to a width its ``view`` cannot take). The
    check (``widths.checked``) first puts back those it is not sure of, then sets each
    module's again only where the outputs still match (which leaves the count as it is), and
    with ``verify=False`` they are put back too: so a candidate that fails as built is measured
    once more with them put back. Where it fails that way too, the check refuses the cut as
    well, and ``prune`` cuts again with the sizes kept or the block whole."""
    try:
        return measure(result.model)
    except Exception as e:  # noqa: BLE001 (the user's forward: any error)
        error = e
    unsure = [c for c in result.widths if not c.sure]  # surgery.WidthChange records
    try:
        for c in unsure:
            setattr(result.model.get_submodule(c.module), c.attr, c.old)
        return measure(result.model)
    except Exception:  # noqa: BLE001 (the first error says more: the widths as built)
        raise GraphError(f"slimming refused its own cut: the pruned network does not run "
                         f"({first_line(error, 160)}); please report the network, and list the module "
                         "it fails in in keep_whole= meanwhile") from None
    finally:  # as built: the check decides which stay put back
        for c in unsure:
            setattr(result.model.get_submodule(c.module), c.attr, c.new)


class _Unrunnable(Exception):
    def __init__(self, result):
        super().__init__()
        self.result = result


def search(model: nn.Module, plan, example: torch.Tensor, amount, limits: dict, checked: bool = False):
    """The PruneResult with the fewest channels cut whose FLOPs (``amount`` a ``target_flops``)
    or parameters (a ``target_params``; ``slimming.pruning.amount.Amount``) are at or under the
    budget; SlimmingError when even the smallest network the limits allow is above it. Records
    the budget in the result.

    A candidate whose forward fails (``measured``) is a GraphError; with ``checked`` (the
    caller runs ``prune``'s check on the result and cuts again where it refuses, as ``prune``
    does with ``verify``) it is returned unmeasured instead (``budget.achieved`` None), for
    the check to refuse it and the caller to cut again with the sizes kept or the block whole,
    as it does any cut the check refuses: only where its forward alone fails on the example
    (with the widths as built and put back), so that the check's fails too."""
    what, asked = amount.what, amount.given
    inputs = as_inputs(example)
    if len(inputs) == 1:  # one image: at batch 1, as stats and the command line count it
        size = tuple(inputs[0].shape[1:])
        measure = (lambda m: count_flops(m, size)) if what == "flops" else count_params
    else:  # several inputs (an image and a timestep): on them as they are
        measure = (lambda m: count_flops(m, inputs=inputs)) if what == "flops" else count_params
    full = measure(model)
    target = parse_budget(amount.value, full, what)
    total = sum(s.numel() for s in plan.scores)

    def at(k: int):
        progress.at(f"{what} budget: trying {k} of {total} channels cut")
        masks, threshold, guarded = select(plan.scores, k / total, None, removable=plan.removable, **limits)
        result = plan.build(masks, threshold, guarded)
        try:
            return result, measured(result, measure)
        except GraphError:
            try:  # the forward alone, as the check runs it: where it runs, the measure failed
                measured(result, lambda m: _run(m, example))
            except GraphError:
                if checked:  # the check refuses it too (its forward fails the same way)
                    result.budget = CountBudget(what, asked, target, None, full, k / total)
                    raise _Unrunnable(result) from None
            raise

    lo, hi = 0, total - 1  # k removed channels; k = total - 1 is the most select() allows
    try:
        best = at(hi)
        if best[1] > target:
            raise BudgetError(f"a budget of {target:.4g} {_NAME[what]} cannot be met: the smallest network "
                                f"min_channels, max_layer_prune and round_to allow has {best[1]:.4g}",
                                param=("min_channels", "max_layer_prune", "round_to"))
        while lo < hi:  # the smallest k whose network meets the budget
            mid = (lo + hi) // 2
            result, value = at(mid)
            if value <= target:
                hi, best = mid, (result, value)
            else:
                lo = mid + 1
    except _Unrunnable as e:  # the check refuses it too: the caller cuts again (sizes kept, block whole)
        return e.result
    result, value = best
    result.budget = CountBudget(what, asked, target, value, full, hi / total)
    return result


def _run(m: nn.Module, example: torch.Tensor) -> None:
    """One forward of ``m`` in eval mode (its modes put back), its output dropped."""
    with torch.no_grad(), modes_kept(m):
        m.eval()
        m(*as_inputs(example))
