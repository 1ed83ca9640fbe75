"""What a prune gives, as typed records: ``PruneResult`` (the smaller network and how it was cut
from the original), and what a budget asked and the cut achieved (``PruneResult.budget``).

``CountBudget`` is a FLOPs or parameter budget's; ``LatencyBudget`` a latency budget's, with
every measured round (``LatencyRound``). Figures of latency are the estimates of
``slimming.measure.timing`` (a low quantile of interleaved samples) with their spread, so the
ratio is the pruned figure over the original's of the same round, and two runs of one prune
agree within the spreads they print. ``as_dict()`` gives the plain values a checkpoint keeps
(``weights_only`` loads them); ``from_dict`` reads them back, ``None`` for anything else.

``result.budget`` was a dict in 0.2.0; ``record["fraction"]`` and the other old keys still read
the same figures, with a FutureWarning naming the attribute, and 0.2.0's files still read.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, field, fields

import torch
from torch import nn

ModuleMasks = dict[str, dict[str, torch.Tensor]]  # conv/linear name -> {"in"/"out": keep-mask}


class _Keyed:
    """``record[old_key]`` as the dict of 0.3 had it, with a FutureWarning."""

    OLD: dict[str, str] = {}

    def __getitem__(self, key: str):
        name = self.OLD.get(key, key)
        if not isinstance(key, str) or name.startswith("_") or name == "OLD" \
                or callable(getattr(self, name, len)):
            raise KeyError(key)
        warnings.warn(f"{type(self).__name__} is a record now: read .{name}, not [{key!r}]",
                      FutureWarning, stacklevel=2)
        return getattr(self, name)

    def get(self, key: str, default=None):
        try:
            return self[key]
        except KeyError:
            return default


@dataclass
class CountBudget(_Keyed):
    """A FLOPs (``what="flops"``) or parameter (``"params"``) budget: ``asked`` as given (a
    fraction or a count), ``target`` the count it means, ``achieved`` the pruned network's
    count (None: a candidate that did not run, for the check to refuse), ``full`` the
    original's, ``percent`` the share of ranked channels cut."""

    what: str
    asked: float
    target: float
    achieved: float | None
    full: float
    percent: float

    @property
    def met(self) -> bool:
        return self.achieved is not None and self.achieved <= self.target

    @property
    def runtime(self) -> None:
        return None

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class LatencyRound(_Keyed):
    """One measurement of a candidate cut against the original, in turn: ``ms`` and
    ``original_ms`` with their spreads, ``ratio`` (``ms / original_ms``) with its own, the
    table's estimate of the cut (``estimated_ms``) and the goal it aimed at (``goal_ms``; None:
    bisected on measurements alone), and the rounds of samples it took."""

    OLD = {"achieved_ms": "ms", "spread_ms": "ms_spread", "fraction": "ratio",
           "fraction_spread": "ratio_spread", "error": "ratio_spread"}

    estimated_ms: float
    goal_ms: float | None
    ms: float
    ms_spread: float
    original_ms: float
    original_spread: float
    ratio: float
    ratio_spread: float
    samples: int


@dataclass
class LatencyBudget(_Keyed):
    """A latency budget: ``asked`` in ``unit`` ("fraction" of the original's, or "ms"),
    ``target_ms`` what it means here; ``rounds`` every measurement, ``chosen`` the one
    returned, whose figures ``ms``, ``ratio``, ``original_ms`` (and spreads) are; ``achieved``
    and ``spread`` in the asked's unit; ``met``: within the spread (or 5%) of the budget or
    under it. ``runtime`` and ``batch``: what was timed; ``table``: the lookup table's cost and
    context (device, torch, threads)."""

    OLD = {"kind": "unit", "target": "target_ms", "fraction": "ratio", "fraction_spread": "ratio_spread",
           "original": "original_ms", "full": "original_ms", "full_spread": "original_spread",
           "error": "ratio_spread"}

    asked: float
    unit: str
    target_ms: float
    met: bool
    rounds: list[LatencyRound]
    chosen: int = -1
    runtime: str = "eager"
    batch: int | None = None
    table: dict = field(default_factory=dict)
    what = "latency"

    @property
    def best(self) -> LatencyRound:
        return self.rounds[self.chosen]

    # the chosen round's figures, read off it
    ms = property(lambda self: self.best.ms)
    ms_spread = property(lambda self: self.best.ms_spread)
    original_ms = property(lambda self: self.best.original_ms)
    original_spread = property(lambda self: self.best.original_spread)
    ratio = property(lambda self: self.best.ratio)
    ratio_spread = property(lambda self: self.best.ratio_spread)

    @property
    def achieved(self) -> float:
        return self.ratio if self.unit == "fraction" else self.ms

    @property
    def spread(self) -> float:
        return self.ratio_spread if self.unit == "fraction" else self.ms_spread

    def as_dict(self) -> dict:
        """Plain values (the figures of the chosen round repeated at the top, for readers)."""
        d = asdict(self)
        d.update(what="latency", ms=self.ms, ms_spread=self.ms_spread, original_ms=self.original_ms,
                 ratio=self.ratio, ratio_spread=self.ratio_spread)
        return d

    @classmethod
    def from_dict(cls, d) -> LatencyBudget | None:
        """The record ``as_dict`` wrote, None for anything else (a damaged or foreign field)."""
        try:
            if isinstance(d, dict) and "unit" not in d and d.get("kind") in ("fraction", "ms"):
                d = _old(d)
            if not isinstance(d, dict) or d.get("what") != "latency" \
                    or d.get("unit") not in ("fraction", "ms"):
                return None
            rounds = [LatencyRound(**{f.name: r[f.name] for f in fields(LatencyRound)}) for r in d["rounds"]]
            numbers = [d["asked"], d["target_ms"], *(getattr(r, f.name) for r in rounds for f in fields(r)
                                                     if f.name != "goal_ms")]
            chosen = d.get("chosen", -1)
            if not rounds or not all(_finite(v) for v in numbers) or not isinstance(chosen, int) \
                    or isinstance(chosen, bool) or not -len(rounds) <= chosen < len(rounds):
                return None
            batch, table = d.get("batch"), d.get("table")
            return cls(float(d["asked"]), d["unit"], float(d["target_ms"]), bool(d["met"]), rounds,
                       d.get("chosen", -1), str(d.get("runtime", "eager")),
                       batch if isinstance(batch, int) and not isinstance(batch, bool) else None,
                       table if isinstance(table, dict) else {})
        except (KeyError, TypeError, IndexError, ValueError):
            return None


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _old(d: dict) -> dict:
    """A latency budget as 0.2.0's files kept it (one dict of the chosen round's figures) in
    ``as_dict``'s form: that round alone."""
    fraction, original = d.get("fraction"), d.get("original")
    one = {"estimated_ms": d.get("achieved"), "goal_ms": None, "ms": d.get("achieved"),
           "ms_spread": d.get("spread", 0.0), "original_ms": original,
           "original_spread": d.get("full_spread", 0.0),
           "ratio": fraction, "ratio_spread": d.get("fraction_spread", 0.0), "samples": 0}
    return {"what": "latency", "unit": d["kind"], "asked": d.get("asked"), "target_ms": d.get("target"),
            "met": d.get("met", True), "rounds": [one], "batch": d.get("batch"), "table": d.get("table")}


@dataclass
class PruneResult:
    """What ``prune`` returns: the smaller network and how it was cut from the original."""

    model: nn.Module
    # a family's widths; for a traced network {factor layer name: width}, the factor layers being
    # its BatchNorms, GroupNorms and LayerNorms (``slimming.layers.rules.is_factor_layer``; gates
    # are in cfg_mask and masks, not here: folded away)
    cfg: list | dict
    cfg_mask: list[torch.Tensor]  # one bool mask per BatchNorm2d (a family) or factor layer, modules() order
    threshold: float | None  # largest score removed (percent) or the threshold given
    layer_names: list[str]  # the original's BatchNorm2d (or factor layer) names, in cfg_mask order
    guarded: list[str] = field(default_factory=list)  # layers the min_channels guard refilled
    # factor layer name -> keep-mask; and a projection of another input's embedding whose rows
    # the cut takes (an AdaGN scale and shift: Traced.conditioning) -> the rows it keeps
    masks: dict[str, torch.Tensor] = field(default_factory=dict)
    layers: ModuleMasks = field(default_factory=dict)  # conv/linear name -> {"in"/"out": mask}
    compensation: dict = field(default_factory=dict)  # what slimming.pruning.repair.compensate folded
    verified: float | None = None  # the check's largest relative difference (None: not checked)
    widths: list = field(default_factory=list)  # integer widths set: surgery.WidthChange records
    # what a budget asked and the cut achieved (``slimming.pruning.records``); None without one
    budget: CountBudget | LatencyBudget | None = None
    # (channels the rule ranks, of them cut): a channel that layers share (a residual stream,
    # a concatenation's reader) counts once; channels the graph keeps (pinned) are not ranked.
    # ``percent`` asks floor(percent * ranked); the limits (min_channels, equal groups) may keep more
    ranked: tuple[int, int] | None = None
    # cuts the check (or the unchecked run) refused, each a Retry: what the next cut kept, and why
    retries: list = field(default_factory=list)
    # modules whose forward read values computed from the input (``if x.mean() > 0.3``; "" the
    # model's own): traced and checked on images in [0, 1] too, where the path may differ
    value_reads: list[str] = field(default_factory=list)
    # layers whose forward computed their weight (weight standardisation), baked into the plain
    # layer they ran where the cut touched them or a gate folds into them (``slimming.layers.baked``):
    # {name: that weight}
    baked: dict[str, torch.Tensor] = field(default_factory=dict)
    # layers a residual branch cut whole left computing nothing or a constant, replaced
    # (``slimming.layers.removed``): {name: "Emptied" or "Constant"}
    removed: dict[str, str] = field(default_factory=dict)

    def __post_init__(self):
        if not self.masks:
            self.masks = dict(zip(self.layer_names, self.cfg_mask))

    def layer_table(self) -> list[tuple[str, int, int]]:
        """(layer name, channels before, channels after) for every BatchNorm2d (a family) or
        factor layer (a traced network)."""
        return [(n, m.numel(), int(m.sum())) for n, m in zip(self.layer_names, self.cfg_mask)]
