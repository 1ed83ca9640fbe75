"""Pruning for speed: a latency budget, measured on the device, and widths the hardware runs fast.

``search`` (``prune(target_latency=...)``) works as HALP (NeurIPS 2022) does, on the network
the user brings: every convolution and linear layer is timed alone at candidate widths (a
lookup table, ``slimming.measure.latency``, kept on disk), which gives each channel group a
latency curve; then channels are taken away greedily, the group whose next step costs the
least importance per millisecond saved first, until the table's estimate meets the budget.
The network so cut is then timed end to end, interleaved with the original (medians, with
the spread of their ratio); where it misses the budget by more than 2% (or the median's own
error, where that is larger), the estimate's goal is corrected by what the measurement showed
and the cut made again (at most ``ROUNDS`` measurements), and every round is reported.

Where the table sees no cut that reaches the budget (layers that cost their launch more than
their width), ``_by_measurement`` bisects the global ranking's share of channels cut on
end-to-end measurements alone, as NetAdapt (ECCV 2018) adapts a network by measuring it.

The table's estimate (``estimate``) ranks the cuts; the end-to-end measurement judges them.
"""

from __future__ import annotations

import heapq
import math
import statistics

import torch
from torch import nn

from ..errors import SlimmingError, parse_latency
from ..measure.latency import LatencyModel, median_spread
from ..utils.modules import modes_kept
from .budget import measured
from .estimate import Estimator, allowed_widths, layer_widths, lower_bounds, save_table, setup
from .graph import GraphError
from .select import SPARSE_BOUND, select

ROUNDS = 5  # end-to-end measurements at most: the first cut and four corrections
TOLERANCE = 0.02  # a round within 2% of the budget (or the median's own error, if larger) is done


def greedy(est: Estimator, scores: list[torch.Tensor], allowed: list[list[int]],
           goal_ms: float) -> tuple[list[int], bool]:
    """Widths per group whose estimate is at or under ``goal_ms``, cutting first the step that
    costs the least importance (the sum of the scores it removes, the lowest of its group) per
    millisecond it saves, as HALP's knapsack does; and whether the estimate got there (False:
    every step that saves anything is taken). A knapsack's greedy can end on one big step far
    under the goal (a residual stream's 8 channels are 5% of a network): the cut is made
    again with that step forbidden, and the one that keeps more importance wins."""
    ranked = [torch.sort(s).values.double() for s in scores]
    cum = [torch.cat([torch.zeros(1, dtype=torch.float64), r.cumsum(0)]) for r in ranked]
    w, reached, last = _greedy(est, cum, allowed, goal_ms, {})
    if reached and last is not None:
        other, also, _ = _greedy(est, cum, allowed, goal_ms, {last[0]: last[1]})
        if also and _kept(cum, est.sizes, other) > _kept(cum, est.sizes, w):
            return other, True
    return w, reached


def _kept(cum, sizes: list[int], w: list[int]) -> float:
    """The importance the widths ``w`` keep: the sum of each group's best ``w[g]`` scores."""
    return sum(float(c[-1] - c[n - k]) for c, n, k in zip(cum, sizes, w))


def _greedy(est: Estimator, cum, allowed: list[list[int]], goal_ms: float, floor: dict[int, int]):
    """``greedy`` once, no group below its ``floor`` (an index into its allowed widths):
    (widths, whether the goal was reached, (group, index) before the last step taken)."""
    w, last = list(est.sizes), None
    total = est.total(w)
    pos = [len(a) - 1 for a in allowed]  # index of each group's current width in its allowed list

    def move(g: int):
        """(importance lost per ms saved, ms saved, index of the width) of group g's next step
        down that saves anything; None when none does."""
        n, here = est.sizes[g], est.group_ms(g, w, w[g])
        for j in range(pos[g] - 1, floor.get(g, 0) - 1, -1):
            to = allowed[g][j]
            saved = here - est.group_ms(g, w, to)
            if saved > 1e-12:
                return float(cum[g][n - to] - cum[g][n - w[g]]) / saved, saved, j
        return None

    heap = []
    for g in range(len(w)):
        if (m := move(g)) is not None:
            heapq.heappush(heap, (m[0], -m[1], g))
    while total > goal_ms and heap:
        _, _, g = heapq.heappop(heap)
        m = move(g)  # the others' widths may have changed what this step saves
        if m is None:
            continue
        if heap and m[0] > heap[0][0] * (1 + 1e-9) + 1e-15:
            heapq.heappush(heap, (m[0], -m[1], g))
            continue
        total -= m[1]
        last = (g, pos[g])
        pos[g] = m[2]
        w[g] = allowed[g][pos[g]]
        if (m := move(g)) is not None:
            heapq.heappush(heap, (m[0], -m[1], g))
    if total <= goal_ms:
        total = _fill(est, cum, allowed, pos, w, total, goal_ms)
    return w, total <= goal_ms, last


def _fill(est: Estimator, cum, allowed, pos: list[int], w: list[int], total: float, goal_ms: float) -> float:
    """In place: the greedy's last step may overshoot the goal by much (a residual stream's
    step saves in many layers at once); give back, one step at a time, the step that regains
    the most importance per millisecond while the estimate stays at or under the goal. A step
    whose channels sparsity training all drove under ``SPARSE_BOUND`` stays cut."""
    while True:
        best = None
        for g in range(len(w)):
            if pos[g] + 1 >= len(allowed[g]):
                continue
            n, up = est.sizes[g], allowed[g][pos[g] + 1]
            added = est.group_ms(g, w, up) - est.group_ms(g, w, w[g])
            if total + added > goal_ms:
                continue
            gained = float(cum[g][n - w[g]] - cum[g][n - up])
            if float(cum[g][n - w[g]] - cum[g][n - w[g] - 1]) < SPARSE_BOUND:  # its highest score
                continue
            value = gained / max(added, 1e-12)
            if best is None or value > best[0]:
                best = (value, g, added)
        if best is None:
            return total
        _, g, added = best
        pos[g] += 1
        w[g] = allowed[g][pos[g]]
        total += added


def _masks(scores: list[torch.Tensor], w: list[int]) -> tuple[list[torch.Tensor], float | None]:
    """Keep-masks with each group's best ``w[g]`` channels, and the largest score removed."""
    masks, cut = [], []
    for s, k in zip(scores, w):
        m = torch.zeros(len(s), dtype=torch.bool)
        m[torch.argsort(s, descending=True, stable=True)[:k]] = True
        masks.append(m)
        cut.append(s[~m])
    removed = torch.cat(cut)
    return masks, (removed.max().item() if len(removed) else None)


def _better(got: float, other: float, asked: float, slack: float) -> bool:
    """A budget is a ceiling: the closest at or under it (within the measurement's ``slack``)
    is best; over it, the least over."""
    if got <= asked + slack:
        return other > asked + slack or got > other
    return other > asked + slack and got < other


def _next_goal(seen: list[tuple], asked: float) -> float:
    """The estimate's next goal: between the two closest goals whose measurements fell either
    side of ``asked`` (linearly), else the last goal scaled by how far its measurement missed."""
    below = [(got, goal) for _, goal, got in seen if got < asked]
    above = [(got, goal) for _, goal, got in seen if got > asked]
    if below and above:
        (g0, e0), (g1, e1) = max(below), min(above)
        return e0 + (asked - g0) * (e1 - e0) / (g1 - g0)
    _, goal, got = seen[-1]
    return goal * asked / max(got, 1e-12)


def search(model: nn.Module, plan, inputs: tuple, target_latency, limits: dict,
           cost: LatencyModel | None = None, checked: bool = False):
    """The PruneResult whose measured latency meets ``target_latency`` (a fraction of the
    original's, or milliseconds), with its budget record: asked, achieved (median) and spread,
    each round's estimate and measurement, and the table's cost. A cut whose forward fails is
    ``budget.search``'s case: GraphError, or with ``checked`` returned unmeasured for the
    caller's check to refuse."""
    kind, asked = parse_latency(target_latency)
    sizes = [len(s) for s in plan.scores]
    est, cost, (full_ms, full_spread) = setup(model, plan, inputs, cost, sizes)
    goal_ms = asked * full_ms if kind == "fraction" else asked
    if goal_ms >= full_ms:
        raise SlimmingError(f"target_latency {target_latency} is at or above the unpruned model's measured "
                            f"{full_ms:.3g} ms: nothing to cut", param="target_latency")
    lows = lower_bounds(sizes, limits["min_channels"], limits["max_layer_prune"])
    allowed = allowed_widths(est, limits["round_to"], lows)
    trial = _Trial(model, plan, inputs, cost, est, kind, asked, goal_ms, checked)

    best, estimate_goal, seen = None, goal_ms, []
    for i in range(ROUNDS):
        w, reached = greedy(est, plan.scores, allowed, estimate_goal)
        if not reached and i == 0:  # the table sees nothing more to save: measure instead
            best = _by_measurement(plan, allowed, limits, kind, asked, trial)
            break
        if any(w == other for other, *_ in seen):
            break  # the goal moved less than one step of the cut: no closer network to time
        tried = trial(*_masks(plan.scores, w), estimate_goal)
        if tried[1] is None:
            return tried[0]
        seen.append((w, estimate_goal, tried[1]))
        if best is None or _better(tried[1], best[1], asked, tried[2]):
            best = tried
        if abs(tried[1] - asked) <= tried[2]:
            break
        estimate_goal = min(_next_goal(seen, asked), est.total(list(sizes)) * 0.999)
    save_table(cost)
    result, got, slack, chosen = best
    if chosen is None:  # a cut that does not run, returned for the check to refuse
        return result
    result.budget = {"what": "latency", "kind": kind, "asked": asked, "target": goal_ms,
                     "achieved": chosen["achieved_ms"], "spread": chosen["spread_ms"],
                     "original": chosen["original_ms"],
                     "fraction": chosen["fraction"], "fraction_spread": chosen["fraction_spread"],
                     "full": full_ms, "full_spread": full_spread,
                     "error": chosen["error"], "met": abs(got - asked) <= slack,
                     "rounds": trial.rounds, "table": cost.describe() if hasattr(cost, "describe") else {},
                     "batch": int(inputs[0].shape[0]) if isinstance(inputs[0], torch.Tensor) else None}
    return result


class _Trial:
    """One round of ``search``: cut, time against the original, record the round. Called with
    (masks, threshold, the goal the estimate aimed at), it gives (result, got, slack, the
    round), the last three None where the cut does not run (``checked``: for the check to
    refuse). ``rounds``: every round so far."""

    def __init__(self, model: nn.Module, plan, inputs: tuple, cost: LatencyModel, est: Estimator,
                 kind: str, asked: float, goal_ms: float, checked: bool):
        self.model, self.plan, self.inputs, self.cost, self.est = model, plan, inputs, cost, est
        self.kind, self.asked, self.goal_ms, self.checked = kind, asked, goal_ms, checked
        self.rounds: list[dict] = []

    def __call__(self, masks, threshold, goal: float | None):
        result = self.plan.build(masks, threshold, [])
        try:  # as prune returns it (budget.measured): a cut that does not run is the check's to refuse
            with modes_kept(self.model), modes_kept(result.model):
                original, pruned = measured(result, lambda m: self.cost.network([self.model, m], self.inputs))
        except GraphError:
            if not self.checked:
                raise
            result.budget = {"what": "latency", "kind": self.kind, "asked": self.asked,
                             "target": self.goal_ms, "achieved": None}
            return result, None, None, None
        ratios = [p / o for p, o in zip(pruned, original)]
        achieved_ms, spread_ms = median_spread(pruned)
        ratio, ratio_spread = median_spread(ratios)
        got, spread = (ratio, ratio_spread) if self.kind == "fraction" else (achieved_ms, spread_ms)
        # how far the median itself may be off: 1.25 sigma / sqrt(n), sigma ~ 1.48 half-IQRs
        error = 1.86 * spread / math.sqrt(len(ratios))
        estimated = self.est.at_widths({n: layer_widths(result.model.get_submodule(n)) for n in
                                        (layer.name for layer in self.est.layers)})
        self.rounds.append({"estimated_ms": estimated, "goal_ms": goal, "achieved_ms": achieved_ms,
                            "original_ms": statistics.median(original), "spread_ms": spread_ms,
                            "fraction": ratio, "fraction_spread": ratio_spread, "error": error,
                            "slack": max(error, TOLERANCE * self.asked)})
        return result, got, self.rounds[-1]["slack"], self.rounds[-1]


def _by_measurement(plan, allowed, limits: dict, kind: str, asked: float, trial):
    """Where the table sees no cut that reaches the budget (layers that cost their launch more
    than their width: a small network on several threads), NetAdapt's way: the global ranking's
    share of channels cut, bisected on end-to-end measurements alone, the smallest network the
    limits allow first (SlimmingError where even it is too slow). ``trial``'s 4-tuple."""
    total = sum(len(s) for s in plan.scores)
    shape = {"min_channels": limits["min_channels"], "max_layer_prune": limits["max_layer_prune"],
             "round_to": allowed if limits["round_to"] == "auto" else limits["round_to"]}

    def at(p: float):
        masks, threshold, _ = select(plan.scores, p, None, **shape)
        return trial(masks, threshold, None)

    lo, hi = 0.0, (total - 1) / total
    best = at(hi)
    if best[1] is not None and best[1] > asked + best[2]:
        unit = " of the original's latency" if kind == "fraction" else " ms"
        raise SlimmingError(f"a latency of {asked:g}{unit} cannot be met: the smallest network "
                            f"min_channels, max_layer_prune and round_to allow runs at {best[1]:.3g}{unit}, "
                            "measured (interleaved with the original)",
                            param=("target_latency", "min_channels", "max_layer_prune", "round_to"))
    for _ in range(ROUNDS - 1):
        if best[1] is None or abs(best[1] - asked) <= best[2]:
            break
        mid = (lo + hi) / 2
        tried = at(mid)
        if tried[1] is None:
            return tried
        if _better(tried[1], best[1], asked, tried[2]):
            best = tried
        lo, hi = (mid, hi) if tried[1] > asked else (lo, mid)
    return best
