"""Pruning for speed: a latency budget, measured on the device, and widths the hardware runs fast.

``search`` (``prune(target_latency=...)``) works as HALP (NeurIPS 2022) does, on the network
the user brings: every convolution and linear layer is timed alone at candidate widths (a
lookup table, ``slimming.measure.latency``, kept on disk), which gives each channel group a
latency curve; then channels are taken away greedily, the group whose next step costs the
least importance per millisecond saved first, until the table's estimate meets the budget.
The network so cut is then timed end to end, interleaved with the original (the estimator of
``slimming.measure.timing``: low quantiles, their ratio and its spread); where it misses the
budget by more than 5% (or the measurement's spread, where that is larger), the estimate's
goal is corrected by what the measurement showed and the cut made again (at most ``ROUNDS``
measurements), and every round is reported.

A measurement takes more rounds of samples until its spread is under ``PRECISION`` of the
budget (or it is clearly off the budget), within the timer's cap; where it is then still over
``NOISE`` (it cannot tell a cut that meets the budget from one that does not), the prune is
refused in one line that says how noisy and what to do. Nothing measured so is reported as a
result, or kept for later prunes.

What the table's estimates were off by, and the original's latency, are remembered per
network (``LatencyModel.remember``): the next prune of that network starts from the corrected
goal and times the original only beside its first cut, so that a warm prune costs about one
round. An original that now runs at another speed than when it was remembered is said.

Where the table sees no cut that reaches the budget (layers that cost their launch more than
their width), ``_by_measurement`` bisects the global ranking's share of channels cut on
end-to-end measurements alone, as NetAdapt (ECCV 2018) adapts a network by measuring it.
"""

from __future__ import annotations

import heapq
import math
import time
import warnings

import torch
from torch import nn

from ..errors import BudgetError, SlimmingError
from ..measure import timing
from ..measure.latency import LatencyModel
from ..utils import progress
from ..utils.modules import modes_kept
from .budget import measured
from .estimate import Estimator, allowed_widths, layer_widths, lower_bounds, save_table, setup
from .graph import GraphError
from .records import LatencyBudget, LatencyRound
from .select import SPARSE_BOUND, select

ROUNDS = 5  # end-to-end measurements at most: the first cut and four corrections
# a round within 5% of the budget (or the measurement's spread, if larger) is done: a cut measured
# again moves by 0.012-0.024 on a quiet 2-core machine (benchmarks/RESULTS.md), so finer is noise
TOLERANCE = 0.05
PRECISION = 0.05  # a measurement takes more samples until its spread is 5% of the budget (0.025 of 0.5)
NOISE = 0.1  # and one still over 10% of it at the timer's cap cannot tell a cut that meets it: refused
REMEMBERED = 8  # (goal, measured) pairs kept per network


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
    side of ``asked`` (linearly), else the goal of the last (the closest, for a memory's)
    scaled by how far its measurement missed."""
    below = [(got, goal) for _, goal, got in seen if got < asked]
    above = [(got, goal) for _, goal, got in seen if got > asked]
    if below and above:
        (g0, e0), (g1, e1) = max(below), min(above)
        return e0 + (asked - g0) * (e1 - e0) / (g1 - g0)
    _, goal, got = seen[-1]
    return goal * asked / max(got, 1e-12)


def search(model: nn.Module, plan, inputs: tuple, amount, limits: dict,
           cost: LatencyModel | None = None, checked: bool = False):
    """The PruneResult whose measured latency meets ``amount``, a ``target_latency``
    (``slimming.pruning.amount.Amount``: a fraction of the original's, or milliseconds), with
    its ``LatencyBudget``: asked, achieved and spread, each
    round's estimate and measurement, the runtime and the table's cost. SlimmingError where
    the machine is too noisy to measure it (``NOISE``). A cut whose forward fails is
    ``budget.search``'s case: GraphError, or with ``checked`` returned unmeasured for the
    caller's check to refuse."""
    unit, asked, target_latency = amount.unit, amount.value, amount.given
    sizes = [len(s) for s in plan.scores]
    est, cost, original, key, memory = setup(model, plan, inputs, cost, sizes, PRECISION)
    if original.relative > NOISE and original.samples:
        raise SlimmingError(_too_noisy("the unpruned network's latency", original, NOISE * original.value,
                                       target_latency), param="target_latency")
    goal_ms = asked * original.value if unit == "fraction" else asked
    if goal_ms >= original.value:
        raise SlimmingError(f"target_latency {target_latency} is at or above the unpruned model's measured "
                            f"{original.value:.3g} ms: nothing to cut", param="target_latency")
    lows = lower_bounds(sizes, limits["min_channels"], limits["max_layer_prune"], plan.removable)
    allowed = allowed_widths(est, limits["round_to"], lows)
    trial = _Trial(model, plan, inputs, cost, est, unit, asked, target_latency, checked)
    prior = [(None, g * original.value, m if unit == "fraction" else m * original.value)
             for g, m in _pairs(memory.get("seen"))]

    best, seen, measured = None, [], False
    # a memory's pairs give the first goal; this network's own measurements the next ones (the
    # table or the gammas may have moved since, and a stale pair must not hold the goal still)
    prior.sort(key=lambda p: -abs(p[2] - asked))
    estimate_goal = min(_next_goal(prior, asked), est.total(list(sizes)) * 0.999) if prior else goal_ms
    for i in range(ROUNDS):
        progress.at(f"latency budget: round {i + 1}")
        w, reached = greedy(est, plan.scores, allowed, estimate_goal)
        if not reached and i == 0 and est.total(w) > goal_ms:  # the table sees nothing more to
            best, measured = _by_measurement(plan, allowed, limits, unit, asked, trial), True  # save:
            break  # measure instead
        if any(w == other for other, *_ in seen):
            break  # the goal moved less than one step of the cut: no closer network to time
        tried = trial(*_masks(plan.scores, w), estimate_goal)
        if tried[1] is None:
            return tried[0]
        seen.append((w, estimate_goal, tried[1]))
        if len(trial.rounds) == 1 and not original.samples:
            _compare(trial.rounds[0], original, memory)
        if best is None or _better(tried[1], best[1], asked, tried[2]):
            best = tried
        if abs(tried[1] - asked) <= tried[2]:
            break
        estimate_goal = min(_next_goal(seen, asked), est.total(list(sizes)) * 0.999)
    if not measured and best[1] is not None and best[1] > asked + best[2]:
        # the table's goals did not bring it under (a network its launches bound more than its
        # widths): the smallest network the limits allow, measured, says whether any meets it
        # (one error line where none does), then the share cut is bisected on measurements
        other = _by_measurement(plan, allowed, limits, unit, asked, trial)
        if other[1] is None:
            return other[0]
        if _better(other[1], best[1], asked, other[2]):
            best = other
    result, got, slack, chosen = best
    if chosen is None:  # a cut that does not run, returned for the check to refuse
        return result
    _remember(cost, key, memory, trial)
    save_table(cost)
    result.budget = LatencyBudget(asked, unit, goal_ms, abs(got - asked) <= slack, trial.rounds,
                                  trial.rounds.index(chosen), getattr(cost, "runtime", "eager"),
                                  int(inputs[0].shape[0]) if isinstance(inputs[0], torch.Tensor) else None,
                                  cost.describe() if hasattr(cost, "describe") else {})
    return result


def _pairs(seen) -> list[tuple[float, float]]:
    """The (goal, measured) pairs a memory holds, as fractions; what is not such a pair is
    left out (a damaged or foreign table)."""
    if not isinstance(seen, list):
        return []
    return [(float(p[0]), float(p[1])) for p in seen if isinstance(p, list) and len(p) == 2
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
                    for v in p)]


def _compare(first: LatencyRound, remembered: timing.Estimate, memory: dict) -> None:
    """One warning where the original now runs at another speed than when it was remembered
    (beyond both spreads, and by over ``NOISE``): a busier or quieter machine, whose figures
    in milliseconds are not the earlier ones (the ratios still are)."""
    now, then = first.original_ms, remembered.value
    if abs(now - then) > max(first.original_spread + remembered.spread, NOISE * then):
        warnings.warn(f"the unpruned network runs at {now:.3g} ms here now, {then:.3g} ms when it was last "
                      f"timed on this device ({memory.get('when', 'earlier')}): the machine is "
                      f"{'busier' if now > then else 'quieter'} than then ({timing.machine_load()}); "
                      "the latency figures are this run's", stacklevel=4)


def _remember(cost, key: str, memory: dict, trial: _Trial) -> None:
    """What the next prune of this network starts from: its latency (every round's samples of
    the original, pooled, where that is precise), and each round's goal against what was
    measured (fractions of the original's latency), the last ``REMEMBERED``."""
    if not hasattr(cost, "remember"):
        return
    seen = list(_pairs(memory.get("seen"))) + [(r.goal_ms / r.original_ms, r.ratio) for r in trial.rounds
                                               if r.goal_ms is not None and r.original_ms > 0]
    record = {**memory, "seen": [list(p) for p in seen[-REMEMBERED:]],
              "when": time.strftime("%Y-%m-%d %H:%M")}
    original = timing.estimate(trial.originals)
    if original.relative <= PRECISION:
        record.update(ms=original.value, spread=original.spread)
    cost.remember(key, record)


def _too_noisy(what: str, e: timing.Estimate, need: float, asked) -> str:
    return (f"latency cannot be measured precisely enough here: after {e.samples} samples {what} is "
            f"{e} ({100 * e.relative:.0f}%), and a budget of {asked} needs +- {need:.2g}; on "
            f"{timing.machine_load()}. Stop other work, time on fewer threads (torch.set_num_threads(1), "
            "or OMP_NUM_THREADS=1 on the command line), or measure longer "
            "(MeasuredLatency(max_seconds=300), --latency-seconds 300)")


class _Trial:
    """One round of ``search``: cut, time against the original (more samples while the ratio
    cannot resolve the budget), record the round. Called with (masks, threshold, the goal the
    estimate aimed at), it gives (result, got, slack, the round), the last three None where
    the cut does not run (``checked``: for the check to refuse). ``rounds``: every round so far."""

    def __init__(self, model: nn.Module, plan, inputs: tuple, cost: LatencyModel, est: Estimator,
                 unit: str, asked: float, given, checked: bool):
        self.model, self.plan, self.inputs, self.cost, self.est = model, plan, inputs, cost, est
        self.unit, self.asked, self.given, self.checked = unit, asked, given, checked
        self.rounds: list[LatencyRound] = []
        self.originals: list[float] = []  # every round's samples of the original, pooled

    def _figure(self, samples: list[list[float]]) -> timing.Estimate:
        """What the budget is judged on: the ratio to the original, or the milliseconds."""
        r = timing.ratio(*samples)
        return r if self.unit == "fraction" else timing.scaled(r, timing.estimate(samples[0]))

    def _enough(self, samples: list[list[float]]) -> bool:
        """Precise enough to resolve the budget, or clearly off it whatever the noise."""
        e = self._figure(samples)
        return e.spread <= PRECISION * self.asked or abs(e.value - self.asked) > 3 * e.spread

    def __call__(self, masks, threshold, goal: float | None):
        result = self.plan.build(masks, threshold, [])
        try:  # as prune returns it (budget.measured): a cut that does not run is the check's to refuse
            with modes_kept(self.model), modes_kept(result.model):
                samples, _ = measured(result, lambda m: timing.sample(
                    self.cost, [self.model, m], self.inputs, self._enough,
                    desc=f"latency: cut {len(self.rounds) + 1} against the original"))
        except GraphError:
            if not self.checked:
                raise
            result.budget = None
            return result, None, None, None
        figure = self._figure(samples)
        if figure.spread > NOISE * self.asked and abs(figure.value - self.asked) <= 3 * figure.spread:
            what = "the cut's latency over the original's" if self.unit == "fraction" \
                else "the cut's latency (ms)"
            raise SlimmingError(_too_noisy(what, figure, NOISE * self.asked, self.given),
                                param="target_latency")
        self.originals += samples[0]
        orig, ratio = timing.estimate(samples[0]), timing.ratio(*samples)
        ms = timing.scaled(ratio, orig)
        estimated = self.est.at_widths({n: layer_widths(result.model.get_submodule(n)) for n in
                                        (layer.name for layer in self.est.layers)})
        self.rounds.append(LatencyRound(estimated, goal, ms.value, ms.spread, orig.value, orig.spread,
                                        ratio.value, ratio.spread, ratio.samples))
        slack = max(figure.spread, TOLERANCE * self.asked)
        return result, figure.value, slack, self.rounds[-1]


def _by_measurement(plan, allowed, limits: dict, unit: str, asked: float, trial):
    """Where the table sees no cut that reaches the budget (layers that cost their launch more
    than their width: a small network on several threads), NetAdapt's way: the global ranking's
    share of channels cut, bisected on end-to-end measurements alone, the smallest network the
    limits allow first (SlimmingError where even it is too slow). ``trial``'s 4-tuple."""
    total = sum(len(s) for s in plan.scores)
    shape = {"min_channels": limits["min_channels"], "max_layer_prune": limits["max_layer_prune"],
             "round_to": allowed if limits["round_to"] == "auto" else limits["round_to"]}

    def at(p: float):
        masks, threshold, _ = select(plan.scores, p, None, removable=plan.removable, **shape)
        return trial(masks, threshold, None)

    lo, hi = 0.0, (total - 1) / total
    best = at(hi)
    if best[1] is not None and best[1] > asked + best[2]:
        what = " of the original's latency" if unit == "fraction" else " ms"
        raise BudgetError(f"a latency of {asked:g}{what} cannot be met: the smallest network "
                            f"min_channels, max_layer_prune and round_to allow runs at {best[1]:.3g}{what}, "
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
