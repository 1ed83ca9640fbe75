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

``step_widths`` (``round_to="auto"``) gives each group the widths at the top of a step of its
latency staircase: the widest width of each cost, one channel more and some layer is slower.

The model of a layer's latency is separable (a layer timed at its full input width across its
output widths, and the other way round), calibrated so that the full network's estimate is its
measured latency; what no table entry covers (activations, normalisations, additions) is
counted in proportion to each layer's output (its width times its output positions). It ranks
moves; the end-to-end measurement judges them.
"""

from __future__ import annotations

import heapq
import math
import re
import statistics
from dataclasses import dataclass, field

import torch
from torch import nn

from ..errors import SlimmingError, number
from ..measure.latency import LatencyModel, LayerSpec, MeasuredLatency, layer_specs, median_spread
from ..utils.modules import modes_kept
from .budget import measured
from .graph import GraphError
from .select import SPARSE_BOUND, select

ROUNDS = 5  # end-to-end measurements at most: the first cut and four corrections
TOLERANCE = 0.02  # a round within 2% of the budget (or the median's own error, if larger) is done
STEP = 0.01  # round_to="auto": a width is kept when it is at least 1% faster than every wider one
_MS = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*(ms|s)?\s*$", re.IGNORECASE)


def parse_latency(value) -> tuple[str, float]:
    """A latency budget as ("fraction", f) for a number in (0, 1) (of the original's measured
    latency) or ("ms", v) for milliseconds: a number >= 1 or a string with its unit ("12ms",
    "0.012s", "12")."""
    if isinstance(value, str):
        found = _MS.match(value)
        if not found:
            raise SlimmingError(f"target_latency takes a fraction such as 0.5 or a time such as 12ms, "
                                f"not {value!r}", param="target_latency")
        amount, unit = float(found[1]), (found[2] or "").lower()
        if unit:
            value = amount * (1000 if unit == "s" else 1)
            if not 0 < value < math.inf:
                raise SlimmingError(f"target_latency must be a positive time, got {found[0]!r}",
                                    param="target_latency")
            return "ms", value
        value = amount
    number(value, "target_latency")
    if not (0 < value < math.inf):
        raise SlimmingError(f"target_latency must be a fraction in (0, 1) or milliseconds, got {value:g}",
                            param="target_latency")
    return ("fraction", float(value)) if value < 1 else ("ms", float(value))


def _widths(m: nn.Module) -> tuple[int, int]:
    if isinstance(m, nn.Linear):
        return m.in_features, m.out_features
    return m.in_channels, m.out_channels


@dataclass
class _Layer:
    """A timed layer, its widths as linear functions of the groups' cuts (``ins``/``outs``: group
    index -> channels lost per channel the group loses), and its share of the untimed rest."""

    name: str
    spec: LayerSpec
    ins: dict[int, float] = field(default_factory=dict)
    outs: dict[int, float] = field(default_factory=dict)
    rest: float = 0.0


def grid(full: int) -> list[int]:
    """The widths a layer of ``full`` channels is timed at: multiples of a step (8 channels,
    or a power of two times 8: what vector units and kernels block by; at most 24 widths or
    so), and ``full``; every width under 16 for a thin one."""
    if full < 16:
        return list(range(1, full + 1))
    q = 8 * 2 ** max(0, math.ceil(math.log2(full / (8 * 24))))
    return sorted({*range(q, full, q), full})


def _up(points: list[int], w: float) -> int:
    """The smallest of ``points`` at or above ``w`` (a width between two costs as the wider)."""
    for p in points:
        if p >= w - 1e-6:
            return p
    return points[-1]


class Estimator:
    """A network's latency from the table, as a function of its groups' widths (free channels
    kept per group, ``full``: each group's count), calibrated on the original's measurement."""

    def __init__(self, layers: list[_Layer], cost: LatencyModel, sizes: list[int], measured_ms: float):
        self.layers, self.cost, self.sizes = layers, cost, sizes
        self.by_group: dict[int, list[_Layer]] = {}
        for layer in layers:
            for g in {*layer.ins, *layer.outs}:
                self.by_group.setdefault(g, []).append(layer)
        self.full_ms = {layer.name: cost.layer(layer.spec, layer.spec.full_in, layer.spec.full_out)
                        for layer in layers}
        timed = sum(self.full_ms.values())
        rest = max(measured_ms - timed, 0.0)  # normalisations, activations, additions: per element
        outs = sum(layer.spec.full_out * layer.spec.positions for layer in layers) or 1
        for layer in layers:
            layer.rest = rest * layer.spec.full_out * layer.spec.positions / outs
        self.scale = measured_ms / max(timed + rest, 1e-9)

    def widths_of(self, layer: _Layer, w: list[int]) -> tuple[float, float]:
        s = layer.spec
        cut_in = sum(a * (self.sizes[g] - w[g]) for g, a in layer.ins.items())
        cut_out = sum(a * (self.sizes[g] - w[g]) for g, a in layer.outs.items())
        return max(s.full_in - cut_in, 1), max(s.full_out - cut_out, 1)

    def layer_ms(self, layer: _Layer, width_in: float, width_out: float) -> float:
        """One layer's estimate at these widths: the timed width at or above each."""
        s, full = layer.spec, self.full_ms[layer.name]
        if s.depthwise:
            w = _up(grid(s.full_in), width_in)
            t = self.cost.layer(s, w, max(1, round(w * s.full_out / s.full_in)))
        else:
            t_in = self.cost.layer(s, _up(grid(s.full_in), width_in), s.full_out)
            t_out = self.cost.layer(s, s.full_in, _up(grid(s.full_out), width_out))
            t = t_in * t_out / full if full > 0 else 0.0
        return self.scale * (t + layer.rest * width_out / s.full_out)

    def of_layers(self, layers, w: list[int]) -> float:
        return sum(self.layer_ms(layer, *self.widths_of(layer, w)) for layer in layers)

    def total(self, w: list[int]) -> float:
        return self.of_layers(self.layers, w)

    def at_widths(self, widths: dict[str, tuple[int, int]]) -> float:
        """The estimate of a built network: each layer at its actual (in, out) widths."""
        return sum(self.layer_ms(layer, *widths[layer.name]) for layer in self.layers if layer.name in widths)

    def group_ms(self, g: int, w: list[int], width: int) -> float:
        """What the layers of group ``g`` cost with it at ``width`` and the others as in ``w``."""
        saved, w[g] = w[g], width
        try:
            return self.of_layers(self.by_group.get(g, ()), w)
        finally:
            w[g] = saved

    def candidates(self, g: int) -> list[int]:
        """The widths of group ``g`` at which some layer it feeds or makes reaches a timed width:
        between two of them, the table sees no difference. Ascending, with the full count."""
        n, found = self.sizes[g], {self.sizes[g]}
        for layer in self.by_group.get(g, ()):
            for a, full in ((layer.ins.get(g), layer.spec.full_in), (layer.outs.get(g), layer.spec.full_out)):
                if a:
                    for p in grid(full):
                        w = math.floor(n - (full - p) / a + 1e-6)
                        if 1 <= w < n:
                            found.add(w)
        return sorted(found)


def probe(plan, model: nn.Module, specs: dict[str, LayerSpec]) -> list[_Layer]:
    """Which groups set which layer's widths, by cutting each group by half on its own (one
    build per group): a layer whose input (output) lost ``d`` channels when its group lost
    ``c`` reads (makes) ``d / c`` per channel. Layers no group touches (a head kept by
    ``ignore``) stay in, at their one width: what they cost, the cut does not save."""
    ones = [torch.ones(len(s), dtype=torch.bool) for s in plan.scores]
    base = plan.build(ones, None, [])
    before = {name: _widths(base.model.get_submodule(name)) for name in specs}
    layers = {name: _Layer(name, spec) for name, spec in specs.items()}
    for g, s in enumerate(plan.scores):
        cut = len(s) // 2
        if cut == 0:
            continue
        masks = [m.clone() for m in ones]
        masks[g][torch.argsort(s, stable=True)[:cut]] = False
        new = plan.build(masks, None, []).model
        for name, (i0, o0) in before.items():
            i1, o1 = _widths(new.get_submodule(name))
            if i1 != i0:
                layers[name].ins[g] = (i0 - i1) / cut
            if o1 != o0:
                layers[name].outs[g] = (o0 - o1) / cut
    return list(layers.values())


def _lower_bounds(sizes: list[int], min_channels: int, max_layer_prune: float) -> list[int]:
    return [max(min(min_channels, n), math.ceil((1 - max_layer_prune) * n - 1e-9)) for n in sizes]


def allowed_widths(est: Estimator, round_to, lows: list[int]) -> list[list[int]]:
    """Per group, the widths a latency-aimed cut may give it (ascending, the full count last):
    the table's candidates at or above the group's lower bound, rounded up to ``round_to`` (an
    int), or only those at a step's top (``"auto"``)."""
    out = []
    for g, n in enumerate(est.sizes):
        widths = [w for w in est.candidates(g) if w >= lows[g]]
        if lows[g] not in widths and lows[g] < n:
            widths = sorted({lows[g], *widths})
        if round_to == "auto":
            widths = _step_tops(est, g, widths)
        elif round_to > 1:
            widths = sorted({min(n, -(-w // round_to) * round_to) for w in widths})
        out.append(widths)
    return out


def _step_tops(est: Estimator, g: int, widths: list[int]) -> list[int]:
    """Of ``widths`` (ascending), those at least ``STEP`` faster than every wider one kept: the
    widest width of each step of the group's latency staircase."""
    full = list(est.sizes)
    kept, best = [widths[-1]], est.group_ms(g, full, widths[-1])
    for w in reversed(widths[:-1]):
        t = est.group_ms(g, full, w)
        if t < best * (1 - STEP):
            kept.append(w)
            best = t
    return sorted(kept)


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


def setup(model: nn.Module, plan, inputs: tuple, cost: LatencyModel | None, sizes: list[int]):
    """The table's estimator of ``model`` and the original's latency (median, spread, samples)."""
    device = next(model.parameters()).device
    cost = cost if cost is not None else MeasuredLatency(device)
    with modes_kept(model):
        model.eval()
        specs = layer_specs(model, inputs)
        samples = cost.network([model], inputs)[0]
    layers = probe(plan, model, specs)
    median, spread = median_spread(samples)
    return Estimator(layers, cost, sizes, median), cost, (median, spread)


def step_widths(model: nn.Module, plan, inputs: tuple, cost: LatencyModel | None,
                limits: dict) -> list[list[int]]:
    """``round_to="auto"``: per group, the widths at the top of a step of its measured latency
    staircase (for ``select``: each group's kept count rounds up to the next of them)."""
    sizes = [len(s) for s in plan.scores]
    est, cost, _ = setup(model, plan, inputs, cost, sizes)
    lows = _lower_bounds(sizes, limits["min_channels"], limits["max_layer_prune"])
    widths = allowed_widths(est, "auto", [1] * len(sizes))
    _save(cost)
    return [[w for w in ws if w >= lo] or [ws[-1]] for ws, lo in zip(widths, lows)]


def _save(cost) -> None:
    if hasattr(cost, "save"):
        cost.save()


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
    lows = _lower_bounds(sizes, limits["min_channels"], limits["max_layer_prune"])
    allowed = allowed_widths(est, limits["round_to"], lows)
    rounds: list[dict] = []

    def trial(masks, threshold, goal: float | None):
        """Cut, time against the original, record the round: (result, got, slack, the round),
        the last three None where the cut does not run (``checked``: for the check to refuse)."""
        result = plan.build(masks, threshold, [])
        try:  # as prune returns it (budget.measured): a cut that does not run is the check's to refuse
            with modes_kept(model), modes_kept(result.model):
                original, pruned = measured(result, lambda m: cost.network([model, m], inputs))
        except GraphError:
            if not checked:
                raise
            result.budget = {"what": "latency", "kind": kind, "asked": asked, "target": goal_ms,
                             "achieved": None}
            return result, None, None, None
        ratios = [p / o for p, o in zip(pruned, original)]
        achieved_ms, spread_ms = median_spread(pruned)
        ratio, ratio_spread = median_spread(ratios)
        got, spread = (ratio, ratio_spread) if kind == "fraction" else (achieved_ms, spread_ms)
        # how far the median itself may be off: 1.25 sigma / sqrt(n), sigma ~ 1.48 half-IQRs
        error = 1.86 * spread / math.sqrt(len(ratios))
        estimated = est.at_widths({n: _widths(result.model.get_submodule(n)) for n in
                                   (layer.name for layer in est.layers)})
        rounds.append({"estimated_ms": estimated, "goal_ms": goal, "achieved_ms": achieved_ms,
                       "original_ms": statistics.median(original), "spread_ms": spread_ms,
                       "fraction": ratio, "fraction_spread": ratio_spread, "error": error,
                       "slack": max(error, TOLERANCE * asked)})
        return result, got, rounds[-1]["slack"], rounds[-1]

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
    _save(cost)
    result, got, slack, chosen = best
    if chosen is None:  # a cut that does not run, returned for the check to refuse
        return result
    result.budget = {"what": "latency", "kind": kind, "asked": asked, "target": goal_ms,
                     "achieved": chosen["achieved_ms"], "spread": chosen["spread_ms"],
                     "original": chosen["original_ms"],
                     "fraction": chosen["fraction"], "fraction_spread": chosen["fraction_spread"],
                     "full": full_ms, "full_spread": full_spread,
                     "error": chosen["error"], "met": abs(got - asked) <= slack,
                     "rounds": rounds, "table": cost.describe() if hasattr(cost, "describe") else {},
                     "batch": int(inputs[0].shape[0]) if isinstance(inputs[0], torch.Tensor) else None}
    return result


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
