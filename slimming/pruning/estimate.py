"""A network's latency from a lookup table of its layers, as a function of its channel groups'
widths: what a latency budget (``speed``) ranks its cuts by, and ``round_to="auto"``'s steps.

Every convolution and linear layer is timed alone (``slimming.measure.latency``) at candidate
widths (``grid``), across its output widths at its full input width and the other way round;
which groups set which layer's widths comes from cutting each group on its own (``probe``).
The model of a layer is separable, calibrated so that the full network's estimate is its
measured latency; what no table entry covers (normalisations, activations, additions) is
counted in proportion to each layer's output (its width times its output positions).

``step_widths`` (``round_to="auto"``) gives each group the widths at the top of a step of its
latency staircase: the widest width of each cost, one channel more and some layer is slower.
"""

from __future__ import annotations

import hashlib
import json
import math
import warnings
from dataclasses import dataclass, field

import torch
from torch import nn

from ..layers.removed import Constant, Emptied
from ..measure import timing
from ..measure.latency import LatencyModel, LayerSpec, MeasuredLatency, layer_specs
from ..utils import progress
from ..utils.modules import modes_kept

STEP = 0.01  # round_to="auto": a width is kept when it is at least 1% faster than every wider one


def layer_widths(m: nn.Module) -> tuple[int, int]:
    """(input, output) width of a convolution or linear layer; (0, 0) for one a branch cut
    whole replaced (``slimming.layers.removed``), which costs nothing."""
    if isinstance(m, (Emptied, Constant)):
        return 0, 0
    if isinstance(m, nn.Linear):
        return m.in_features, m.out_features
    return m.in_channels, m.out_channels


@dataclass
class TimedLayer:
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

    def __init__(self, layers: list[TimedLayer], cost: LatencyModel, sizes: list[int], measured_ms: float):
        self.layers, self.cost, self.sizes = layers, cost, sizes
        self.by_group: dict[int, list[TimedLayer]] = {}
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

    def widths_of(self, layer: TimedLayer, w: list[int]) -> tuple[float, float]:
        s = layer.spec
        cut_in = sum(a * (self.sizes[g] - w[g]) for g, a in layer.ins.items())
        cut_out = sum(a * (self.sizes[g] - w[g]) for g, a in layer.outs.items())
        return max(s.full_in - cut_in, 0), max(s.full_out - cut_out, 0)

    def layer_ms(self, layer: TimedLayer, width_in: float, width_out: float) -> float:
        """One layer's estimate at these widths: the timed width at or above each; nothing for
        a layer that reads or makes no channel (a branch cut whole removes it, its fixed cost
        with it: what the latency search weighs against thinning others)."""
        s, full = layer.spec, self.full_ms[layer.name]
        if width_in < 0.5 or width_out < 0.5:
            return 0.0
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


def probe(plan, model: nn.Module, specs: dict[str, LayerSpec]) -> list[TimedLayer]:
    """Which groups set which layer's widths, by cutting each group by half on its own: a
    layer whose input (output) lost ``d`` channels when its group lost ``c`` reads (makes)
    ``d / c`` per channel. A traced plan says each module's masks without building
    (``plan.cuts``); a family's is built, once per group. Layers no group touches (a head kept
    by ``ignore``) stay in, at their one width: what they cost, the cut does not save."""
    ones = [torch.ones(len(s), dtype=torch.bool) for s in plan.scores]
    if plan.cuts is not None:
        def widths(masks) -> dict[str, tuple[int, int]]:
            cut = plan.cuts(masks)
            return {name: _widths(cut.get(name, {}), s) for name, s in specs.items()}
    else:
        def widths(masks) -> dict[str, tuple[int, int]]:
            new = plan.build(masks, None, []).model
            return {name: layer_widths(new.get_submodule(name)) for name in specs}
    before = widths(ones)
    layers = {name: TimedLayer(name, spec) for name, spec in specs.items()}
    for g, s in enumerate(plan.scores):
        cut = len(s) // 2
        if cut == 0:
            continue
        masks = [m.clone() for m in ones]
        masks[g][torch.argsort(s, stable=True)[:cut]] = False
        for name, (i1, o1) in widths(masks).items():
            i0, o0 = before[name]
            if i1 != i0:
                layers[name].ins[g] = (i0 - i1) / cut
            if o1 != o0:
                layers[name].outs[g] = (o0 - o1) / cut
    return list(layers.values())


def _widths(cut: dict, spec: LayerSpec) -> tuple[int, int]:
    """A layer's (input, output) width from its keep-masks (``surgery.plan``'s "in", "out", or
    "channels" for what it carries: a depthwise convolution)."""
    both = cut.get("channels")
    read, made = cut.get("in", both), cut.get("out", both)
    return (spec.full_in if read is None else int(read.sum()),
            spec.full_out if made is None else int(made.sum()))


def lower_bounds(sizes: list[int], min_channels: int, max_layer_prune: float, removable=()) -> list[int]:
    """The fewest channels each group may keep: ``min_channels`` (all, if it has fewer; none
    for a group in ``removable``, a residual branch's width) and what ``max_layer_prune``
    leaves, as ``select`` counts them."""
    return [max(0 if g in removable else min(min_channels, n), math.ceil((1 - max_layer_prune) * n - 1e-9))
            for g, n in enumerate(sizes)]


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


def setup(model: nn.Module, plan, inputs: tuple, cost: LatencyModel | None, sizes: list[int],
          noise: float | None = None):
    """(the table's estimator of ``model``, the latency model, the original's latency as a
    ``timing.Estimate`` in ms, the network's key in the latency memory, what the memory holds
    of it). The original is timed until its spread is within ``noise`` of it (None: one call),
    or not at all where the memory holds its latency (``Estimate.samples`` 0): a prune then
    times it beside its first cut."""
    device = next(model.parameters()).device
    cost = cost if cost is not None else MeasuredLatency(device)
    with modes_kept(model):
        model.eval()
        specs = layer_specs(model, inputs)
        key = network_key(model, inputs, specs)
        memory = (cost.recall(key) if hasattr(cost, "recall") else None) or {}
        ms, spread = _number(memory.get("ms")), _number(memory.get("spread"))
        if noise is not None and ms > 0 and 0 <= spread <= noise * ms:
            original = timing.Estimate(ms, spread, 0)
        else:
            samples, _ = timing.sample(cost, [model], inputs, lambda s: noise is None or
                                       timing.estimate(s[0]).relative <= noise, desc="latency: the original")
            original = timing.estimate(samples[0])
    layers = probe(plan, model, specs)
    fill(cost, layers)
    return Estimator(layers, cost, sizes, original.value), cost, original, key, memory


def fill(cost: LatencyModel, layers: list[TimedLayer]) -> None:
    """Time every width the estimate will ask of ``layers`` that the table lacks, up front and
    with a progress bar: each layer at full widths, and where a group moves one of its widths,
    at every ``grid`` width of that side (a depthwise layer: of both at once)."""
    wanted = []
    for layer in layers:
        s = layer.spec
        wanted.append((s, s.full_in, s.full_out))
        if s.depthwise and (layer.ins or layer.outs):
            wanted += [(s, w, max(1, round(w * s.full_out / s.full_in))) for w in grid(s.full_in)]
        elif not s.depthwise:
            wanted += [(s, w, s.full_out) for w in grid(s.full_in) if layer.ins]
            wanted += [(s, s.full_in, w) for w in grid(s.full_out) if layer.outs]
    known = getattr(cost, "entries", None)
    if known is not None:  # a table: only what it lacks is timed, and counted on the bar
        wanted = [w for w in dict.fromkeys(wanted) if w[0].key(w[1], w[2]) not in known]
    shown = known is not None and bool(wanted)
    for spec, i, o in progress.bar(wanted, desc="latency table", unit="layer", show=shown):
        cost.layer(spec, i, o)


def network_key(model: nn.Module, inputs: tuple, specs: dict[str, LayerSpec]) -> str:
    """What a network is to the latency memory: its timed layers (kinds, shapes, widths) and
    inputs, whatever its weights."""
    shapes = [list(t.shape) if isinstance(t, torch.Tensor) else repr(t) for t in inputs]
    text = json.dumps([type(model).__name__, shapes, [[n, s.key(0, 0)] for n, s in specs.items()]])
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _number(v) -> float:
    """``v`` where it is a finite number, else -1 (a damaged memory reads as none)."""
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else -1.0


def step_widths(model: nn.Module, plan, inputs: tuple, cost: LatencyModel | None,
                limits: dict) -> list[list[int]]:
    """``round_to="auto"``: per group, the widths at the top of a step of its measured latency
    staircase (for ``select``: each group's kept count rounds up to the next of them)."""
    sizes = [len(s) for s in plan.scores]
    est, cost, *_ = setup(model, plan, inputs, cost, sizes)
    lows = lower_bounds(sizes, limits["min_channels"], limits["max_layer_prune"], plan.removable)
    widths = allowed_widths(est, "auto", [0 if g in plan.removable else 1 for g in range(len(sizes))])
    save_table(cost)
    steps = [[w for w in ws if w >= lo] or [ws[-1]] for ws, lo in zip(widths, lows)]
    if all(ws == [n] for ws, n in zip(steps, sizes)):  # no narrower width is any faster here
        warnings.warn("round_to='auto': no layer's measured latency falls with its width on this device "
                      "(each step's top is its full width), so no channel is cut; give round_to a number "
                      "(8) to cut by importance alone", stacklevel=4)
    return steps


def save_table(cost) -> None:
    """Write the table of a latency model that keeps one (``MeasuredLatency``); an injected
    model keeps nothing."""
    if hasattr(cost, "save"):
        cost.save()
