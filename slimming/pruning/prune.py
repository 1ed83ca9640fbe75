"""``slimming.prune``: which channels go together, which to cut, and how to cut them.

"Which go together": for a registered family, each prunable BatchNorm alone (the paper's); for
any other network, the groups of its traced channel graph (``graph``). "Which to cut" is
architecture-free: one global threshold (``select``) or a budget (``budget``) over the scores of
an importance criterion (``importance``; network slimming's |gamma| by default).

"How": any other network is cut along its graph (``surgery``). A family is rebuilt as
``Net(cfg)`` with the surviving widths (on the meta device) and filled with the kept weights by
the surgery its class declares (``SURGERY``): ``"chain"`` (NIN, VGG) walks the old and new
``modules()`` side by side with a ``start_mask`` (input channels) and an ``end_mask`` (output
channels), as the paper's code does; ``"sliced"`` (the pre-activation ResNet and DenseNet, whose
layers read shared tensors) cuts per BN exactly the weights the family lists
(``channel_slices()``). The traced path on VGG and NIN gives the same channels and outputs as
their surgery (tested): each checks the other. Then ``repair`` folds what the cut channels
still gave into the layers that read them.

``prune`` itself is a pipeline of named steps (``_Steps``): ``checked_cut`` plans (the groups,
scored: ``_traced_plan`` / ``_family_plan``), cuts (``_cut``: by share, threshold or budget),
vouches (``_vouch``: the check, or with ``verify=False`` one run of the pruned network), and
where that refuses, keeps what failed (``_retry``: the heads and size splits, then a block's
type) and cuts again, each refusal a ``Retry`` in ``result.retries``; ``settle`` gives a traced
family its cfg, warns, compensates and folds the gates away.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from .. import models
from ..errors import SlimmingError, first_line, listed, number
from ..layers.attention import thinned
from ..layers.baked import baked_layers
from ..layers.gates import ATTR as GATE
from ..layers.gates import fold
from ..layers.rules import ChannelGate, factor_width, is_factor_layer
from ..models.common import BN_STATE
from ..utils.modules import eager_model, keep_slices, modes_kept
from . import budget, estimate, repair, speed, surgery
from .graph import GraphError, Group, ignored_names
from .importance import DEFAULT, Importance, get_importance
from .records import CountBudget, LatencyBudget
from .select import SPARSE_BOUND, equalize, scaled_prunable_bns, select, whole_block_scores
from .surgery import WidthChange
from .trace import as_inputs, trace
from .verify import check, named, runs, second_size


def _take(t: torch.Tensor, dim: int, mask: torch.Tensor | None) -> torch.Tensor:
    """A copy of ``t``, cut to ``mask`` along ``dim`` when there is one."""
    return t.detach().clone() if mask is None else keep_slices(t, mask, dim)


ModuleMasks = dict[str, dict[str, torch.Tensor]]  # conv/linear name -> {"in"/"out": keep-mask}


def copy_chain_weights(old: nn.Module, new: nn.Module, cfg_mask: list[torch.Tensor]) -> ModuleMasks:
    """Fill ``new`` (possibly on the meta device) with the kept weights of ``old``.

    ``cfg_mask`` has one mask per BatchNorm2d of ``old`` in ``modules()`` order. For a chain
    network (conv -> BN -> ... -> linear): a conv keeps input channels ``start_mask`` and output
    channels ``end_mask``; a BN keeps ``end_mask``; a linear keeps input columns ``start_mask``.
    Loading is strict, so a tensor this walk missed is an error, not uninitialised memory.
    Returns each conv's and linear layer's kept input and output channels.
    """
    masks = iter(cfg_mask)
    start_mask, end_mask = None, next(masks, None)
    state, cut = {}, {}
    for (name, m0), (_, m1) in zip(old.named_modules(), new.named_modules()):
        if type(m0) is not type(m1):
            raise ValueError(f"module {name!r}: {type(m0).__name__} vs {type(m1).__name__}")
        prefix = f"{name}." if name else ""
        if isinstance(m0, nn.BatchNorm2d):
            for key in BN_STATE:
                state[prefix + key] = _take(getattr(m0, key), 0, end_mask)
            state[prefix + "num_batches_tracked"] = m0.num_batches_tracked.detach().clone()
            start_mask, end_mask = end_mask, next(masks, None)
        elif isinstance(m0, nn.Conv2d):
            state[prefix + "weight"] = _take(_take(m0.weight, 1, start_mask), 0, end_mask)
            if m0.bias is not None:
                state[prefix + "bias"] = _take(m0.bias, 0, end_mask)
            cut[name] = {k: v for k, v in (("in", start_mask), ("out", end_mask)) if v is not None}
        elif isinstance(m0, nn.Linear):
            state[prefix + "weight"] = _take(m0.weight, 1, start_mask)
            if m0.bias is not None:
                state[prefix + "bias"] = m0.bias.detach().clone()
            cut[name] = {"in": start_mask} if start_mask is not None else {}
    new.load_state_dict(state, assign=True)
    return cut


def copy_sliced_weights(old: nn.Module, new: nn.Module, cfg_mask: list[torch.Tensor]) -> ModuleMasks:
    """Fill ``new`` (possibly on the meta device) with the kept weights of ``old``.

    ``old.channel_slices()`` lists, per BatchNorm2d in ``modules()`` order (``cfg_mask``'s
    order), the (state_dict key, dim) pairs whose extent along dim is that BN's channels; each
    is cut to the mask's kept channels (a conv weight may be cut twice: its output channels by
    one BN's mask, its input channels by another's). Every other tensor is copied whole. Strict
    loading turns any tensor the plan left at a wrong shape into an error. Returns each conv's
    and linear layer's kept input and output channels.
    """
    plan = old.channel_slices()
    if len(plan) != len(cfg_mask):
        raise ValueError(f"{len(cfg_mask)} masks for {len(plan)} BatchNorm layers")
    cuts: dict[str, list[tuple[int, torch.Tensor]]] = {}
    for slices, mask in zip(plan, cfg_mask):
        for key, dim in slices:
            cuts.setdefault(key, []).append((dim, mask))
    state = {}
    for key, t in old.state_dict().items():
        t = t.detach()
        for dim, mask in cuts.pop(key, [(0, None)]):
            if mask is not None and mask.numel() != t.shape[dim]:
                raise ValueError(f"{key}: a mask of {mask.numel()} for {t.shape[dim]} channels (dim {dim})")
            t = _take(t, dim, mask)
        state[key] = t
    if cuts:
        raise ValueError(f"channel_slices() names tensors the model lacks: {', '.join(sorted(cuts))}")
    new.load_state_dict(state, assign=True)
    layers = {name for name, m in old.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))}
    cut: ModuleMasks = {}
    for slices, mask in zip(plan, cfg_mask):
        for key, dim in slices:
            name = key.rsplit(".", 1)[0]
            if name in layers and key.endswith(".weight") and dim in (0, 1):
                cut.setdefault(name, {})["out" if dim == 0 else "in"] = mask
    return cut


# How a family is cut once the masks are known ("how", apart from "which"), by the ``surgery``
# its Net class declares (slimming.models.registry).
SURGERY: dict[str, Callable[[nn.Module, nn.Module, list[torch.Tensor]], ModuleMasks]] = {
    "chain": copy_chain_weights,
    "sliced": copy_sliced_weights,
}


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
    masks: dict[str, torch.Tensor] = field(default_factory=dict)  # factor layer name -> keep-mask
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

    def __post_init__(self):
        if not self.masks:
            self.masks = dict(zip(self.layer_names, self.cfg_mask))

    def layer_table(self) -> list[tuple[str, int, int]]:
        """(layer name, channels before, channels after) for every BatchNorm2d (a family) or
        factor layer (a traced network)."""
        return [(n, m.numel(), int(m.sum())) for n, m in zip(self.layer_names, self.cfg_mask)]


def default_example(model: nn.Module) -> torch.Tensor:
    """One image of the size the model takes: its ``input_size`` (C, H, W) when it has one
    (every family declares one; slimming's builders set one), else 3x224x224."""
    size = getattr(model, "input_size", None) or (3, 224, 224)
    return torch.zeros(1, *size, device=next(model.parameters()).device)


def prune(model: nn.Module, percent: float | None = None, threshold: float | None = None,
          min_channels: int = 1, *, importance: Importance | str | None = None,
          example_inputs: torch.Tensor | None = None, ignore=(),
          surgery: str = "auto", target_flops: float | None = None,
          target_params: float | None = None, round_to: int | str | None = None, max_layer_prune: float = 1.0,
          compensate: bool = True, keep_whole=(), verify: bool = True,
          target_latency: float | str | None = None, latency_model=None,
          cut_heads: bool = True, output_transform: Callable | None = None) -> PruneResult:
    """Slim ``model``: cut its least important channels and build it thinner.

    How many channels go, one of:
    - ``percent``: a fraction of the prunable channels, exactly ``floor(percent * N)``;
    - ``threshold``: every channel scoring at or under it;
    - ``target_flops`` / ``target_params``: a budget, a fraction in (0, 1) of the unpruned
      model's count or an absolute count (``2.5e8``): the fewest channels cut that bring the
      network at or under it (``slimming.pruning.budget``);
    - ``target_latency``: a fraction in (0, 1) of the original's latency, or milliseconds
      (``"12ms"``, or a number >= 1), measured on the device the model is on at the example's
      batch and size: layers timed at candidate widths into a table kept on disk, channels cut
      by importance against latency saved, the result timed end to end against the original
      and corrected (``slimming.pruning.speed``; ``result.budget`` says asked, achieved, spread
      and every round). ``latency_model``: what times (a ``slimming.measure.latency``
      ``LatencyModel``; default ``MeasuredLatency`` on the model's device).
    Then ``min_channels``, ``max_layer_prune`` (the largest fraction any layer loses) and
    ``round_to`` (every width a multiple of it, never above the original; ``"auto"``: the
    widest width of a step of each layer's measured latency staircase; default 1, and 8 under
    a latency budget: the channel blocks vector units and kernels run, ``ROUND_FOR_SPEED``)
    may keep more.

    ``importance`` scores channels: an ``Importance`` or the name of one (default ``"bn-max"``:
    |gamma|, the largest over a group's BatchNorms). A registered family (NIN, VGG,
    pre-activation ResNet, DenseNet, yours) is cut by its own surgery, as the paper does; any
    other network (or any, with ``surgery="graph"``) is traced on ``example_inputs`` (default:
    one image of ``default_example``'s size; a tuple for a forward of several inputs) and cut
    along its channel graph. ``ignore``: modules that keep the channels they make (and their
    inner widths) while the channels they read are cut where their producers are, as a detector
    keeps its head; ``keep_whole``: modules kept whole, what they read included. Both take names
    (a name keeps what is inside it too: ``"head"``) and module types (``nn.Linear``, your
    head's class). ``verify`` (default) runs the pruned network and the original with the cut
    channels' gamma and beta zeroed on one random input of the example's shape, before any
    compensation, and raises GraphError naming the first module whose outputs differ (the
    largest relative difference is in ``result.verified``); ``verify=False`` only runs the pruned
    network once on such an input, and what fails there is handled as a failed check is (the
    block kept whole, the prune made again), so the network it returns runs. ``cut_heads``
    (default): attention heads (a view of the channels into heads) and splits by sizes a
    module keeps in integer attributes (``split([self.key_dim, ...])``) are cut, those
    attributes set; where the check (or, unchecked, the run) fails they are kept and the prune
    made again, with one warning; False keeps them from the start (each cut refused so is in
    ``result.retries``). ``compensate`` (default) folds the
    constant output a cut channel still had (its activation of beta) into the layers that read
    it (``slimming.pruning.repair``); False gives the paper's network exactly.
    ``output_transform`` (Torch-Pruning's name): a function of the model's output giving the
    outputs whose values and widths must stay (default: all of them); a detector head that
    also passes its inputs out (``(y, {"feats": [...]})``) takes ``lambda out: out[0]``, so that
    those features are cut where their producers are and the check compares ``y``. The original
    model is left untouched (every module's train/eval flag too); the new one is on the same
    device, each module in the mode it had.
    """
    model = eager_model(model, "prune")
    importance = _criterion(importance)
    how = dict(percent=percent, threshold=threshold, target_flops=target_flops, target_params=target_params,
               target_latency=target_latency, latency_model=latency_model)
    if round_to is None:  # the paper's exact widths, or under a latency budget widths that run fast
        round_to = ROUND_FOR_SPEED if target_latency is not None else 1
    _check_arguments(surgery, round_to, how, output_transform)
    example = default_example(model) if example_inputs is None else example_inputs
    # ignore / keep_whole on a shipped family: its own surgery knows no such thing, the traced
    # path does (and gives the family's own channels where nothing is ignored: tested)
    traced = surgery == "graph" or models.family(getattr(model, "arch", None)) is None \
        or bool(ignored_names(model, ignore) | ignored_names(model, keep_whole))
    if (target_flops is not None or target_params is not None) and len(as_inputs(example)) != 1:
        raise SlimmingError("a FLOPs or parameter budget needs a model of one input; give "
                            "percent or threshold", param=("target_flops", "target_params"))
    whole = (keep_whole,) if isinstance(keep_whole, (str, type)) else tuple(keep_whole or ())
    steps = _Steps(model, importance, example, traced, ignore, whole, verify,
                   dict(min_channels=min_channels, round_to=round_to, max_layer_prune=max_layer_prune), how,
                   output_transform)
    with modes_kept(model):
        result = steps.checked_cut(follow_sizes=traced and cut_heads)
        steps.settle(result, compensate)
    if isinstance(example, torch.Tensor):  # save_pruned keeps it: load_pruned's forward
        result.model._slimming_example_shape = tuple(example.shape)
    return result


ROUND_FOR_SPEED = 8  # round_to's default under a latency budget (benchmarks/RESULTS.md, "Latency", widths)


def _check_arguments(surgery: str, round_to, how: dict, output_transform) -> None:
    """What prune refuses before any work: an unknown surgery, not exactly one way of saying how
    many channels go, a latency budget it cannot read, a round_to that is no width, an
    output_transform that is no function."""
    if surgery not in ("auto", "graph"):
        raise SlimmingError(f"surgery must be 'auto' or 'graph', got {surgery!r}", param="surgery")
    if sum(how[k] is not None for k in ("percent", "threshold", "target_flops", "target_params",
                                         "target_latency")) != 1:
        raise SlimmingError("give exactly one of percent, threshold, target_flops, target_params and "
                            "target_latency", param=("percent", "threshold", "target_flops", "target_params",
                                                     "target_latency"))
    if how["target_latency"] is not None:
        speed.parse_latency(how["target_latency"])  # a bad budget answers before any work
    if round_to != "auto":
        number(round_to, "round_to", integer=True, low=1)
    if output_transform is not None and not callable(output_transform):
        raise SlimmingError("output_transform takes a function of the model's output (lambda out: out[0]), "
                            f"not {type(output_transform).__name__}", param="output_transform")


@dataclass
class _Steps:
    """prune's pipeline over one model: plan (trace and score, or the family's own walk), cut
    (to the budget), check (``_vouch``), and where the check refuses, keep what failed and go
    again (``_retry``); then settle (warnings, compensation, gates folded)."""

    model: nn.Module
    importance: Importance
    example: object
    traced: bool
    ignore: object
    whole: tuple
    verify: bool
    limits: dict
    how: dict
    output_transform: Callable | None = None

    def checked_cut(self, follow_sizes: bool) -> PruneResult:
        """Plan, cut, check until the check passes; what was retried is in ``result.retries``."""
        kept, retries = (), []
        while True:
            plan = _traced_plan(self.model, self.importance, self.example, self.ignore, (*self.whole, *kept),
                                follow_sizes, self.output_transform) if self.traced \
                else _family_plan(self.model, self.importance)
            result = _cut(self.model, plan, self.example, self.limits, **self.how)
            failure = _vouch(self.model, result, self.example, self.verify, self.output_transform)
            if failure is None:
                result.retries = retries
                return result
            retry = _retry(self.model, failure, plan, follow_sizes, kept, self.traced, self.verify)
            warnings.warn(str(retry), stacklevel=3)
            retries.append(retry)
            if retry.kept == "sizes":
                follow_sizes = False
            else:
                kept = (*kept, retry.block)

    def settle(self, result: PruneResult, compensate: bool) -> None:
        """A family's cfg for a traced family, the warnings a cut deserves, compensation, and
        the gates (``slimming.add_gates``) folded into the layers they feed."""
        if self.traced and models.family(getattr(self.model, "arch", None)) is not None:
            _as_family(self.model, result)
        for note in (little_sparsity(self.model, result), nearly_emptied(result)):
            if note:
                warnings.warn(note, stacklevel=3)
        if compensate:
            result.compensation = repair.compensate(self.model, result, self.example,
                                                    output_transform=self.output_transform)
        fold(result.model)  # gates into the layers they feed: no extra module


@dataclass
class Retry:
    """A cut the check (or, with ``verify=False``, the run) refused, and what the next cut
    kept: ``kept`` "sizes" (the heads and size splits of the ``modules`` named) or "block"
    (every module of the type ``block``, named in ``modules``); ``why``: the failure, in one
    line; ``failed``: "match" (the check) or "run" (the unchecked run). ``str()``: the warning."""

    kept: str
    modules: list[str]
    why: str
    failed: str = "match"
    block: type | None = None

    def __str__(self) -> str:
        failed = f"cut, the network did not {self.failed} ({self.why})"
        if self.kept == "sizes":
            return f"the channels of {listed(self.modules)} are kept: {failed}; its forward reads widths " \
                "the cut cannot set"
        return f"every {self.modules[0]} is kept whole: {failed}"


def _cut(model: nn.Module, plan, example, limits: dict, *, percent, threshold, target_flops,
         target_params, target_latency, latency_model) -> PruneResult:
    """The pruned network ``plan`` gives for the amount asked: a share or a threshold of the
    ranked channels (``select``), a FLOPs or parameter budget (``budget``), or a latency
    (``speed``). A budget's candidate that does not run is returned for the check to refuse."""
    inputs = as_inputs(example)
    if target_latency is not None:
        return speed.search(model, plan, inputs, target_latency, limits, latency_model, checked=True)
    cut_limits = dict(limits)
    if limits["round_to"] == "auto":  # this plan's groups' step widths
        cut_limits["round_to"] = estimate.step_widths(model, plan, inputs, latency_model, limits)
    if target_flops is not None or target_params is not None:
        return budget.search(model, plan, example, target_flops, target_params, cut_limits, checked=True)
    masks, cut_at, guarded = select(plan.scores, percent, threshold, **cut_limits)
    return plan.build(masks, cut_at, guarded)


def _vouch(model: nn.Module, result: PruneResult, example, verify: bool,
           output_transform=None) -> GraphError | None:
    """The check (``verify``: ``result.verified`` set) or, unchecked, one run of the pruned
    network with only its sure widths set; the GraphError where it refuses, else None."""
    try:
        if verify:
            result.verified = _checked(model, result, example, output_transform)
        else:
            if any(not change.sure for change in result.widths):
                _settle(result, lambda: None, keep=lambda change: change.sure)
            runs(result, example)
    except GraphError as e:
        return e
    return None


def _retry(model: nn.Module, failure: GraphError, plan, follow_sizes: bool, kept: tuple, traced: bool,
           verify: bool) -> Retry:
    """What to keep for the next cut after ``failure``: the sizes the plan followed, else the
    block (the type of the innermost module of the user's code) the failure names, for at most
    three blocks; the failure itself where there is nothing left to keep."""
    failed, why = "match" if verify else "run", first_line(failure, 160)
    if plan.sized and follow_sizes:
        return Retry("sizes", list(plan.sized), why, failed)
    block = _block_of(model, getattr(failure, "module", None))
    if not traced or block is None or block in kept or len(kept) >= 3:
        raise failure
    return Retry("block", [block.__name__], why, failed, block)


def _criterion(importance) -> Importance:
    """``importance`` as a criterion: a registered name, an ``Importance`` (or any callable
    ``(model, group) -> scores``); SlimmingError for a class not instantiated, or anything else."""
    if importance is None:
        return DEFAULT
    if isinstance(importance, str):
        return get_importance(importance)
    if isinstance(importance, type):
        raise SlimmingError(f"importance takes a criterion, not the class {importance.__name__}: pass "
                            f"{importance.__name__}() or a name such as 'bn-max'", param="importance")
    if not callable(importance):
        raise SlimmingError(f"importance takes a name ('bn-max', 'bn-mean', ...) or an Importance, "
                            f"not {type(importance).__name__}", param="importance")
    if type(importance).__call__ is Importance.__call__:
        raise SlimmingError(f"importance: {type(importance).__name__} is the base class, which scores "
                            "nothing; subclass it and define __call__, or pass a name such as 'bn-max'",
                            param="importance")
    return importance


def _scores(importance, model: nn.Module, group: Group) -> torch.Tensor:
    """The criterion's scores for ``group``, checked: a 1-D real tensor, one score per channel
    (``select`` then refuses scores that are not finite)."""
    s = importance(model, group)
    if not isinstance(s, torch.Tensor) or s.dim() != 1 or len(s) != group.size or s.is_complex():
        got = f"a tensor of shape {tuple(s.shape)}" if isinstance(s, torch.Tensor) else type(s).__name__
        raise SlimmingError(f"importance {importance!r} gave {got} for a group of {group.size} channels; "
                            f"it must give one score per channel (a 1-D tensor of {group.size})",
                            param="importance")
    return s.detach().float().cpu().clone()  # its own memory: whole_block_scores writes in it


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


def nearly_emptied(result: PruneResult, share: float = 0.05, wide: int = 20) -> str | None:
    """What to say when the cut leaves a wide layer (``wide`` channels or more) under ``share``
    of its channels: the network may be near chance right after the cut."""
    thin = [(n, b, a) for n, b, a in result.layer_table() if b >= wide and a < share * b]
    if not thin:
        return None
    n, b, a = min(thin, key=lambda t: t[2] / t[1])
    return (f"{len(thin)} layer(s) keep under {share:.0%} of their channels ({n} keeps {a} of "
            f"{b}): the network may be near chance until it is fine-tuned; max_layer_prune "
            "(--max-layer-prune) caps what one layer loses")


def _checked(model: nn.Module, result: PruneResult, example, output_transform=None) -> float:
    """``verify.check``, and where the cut set integer widths the forward reads as sizes (the
    sure ones: a reshape's, a split's, a number of heads) or baked a weight a forward computed
    (``PruneResult.baked``) at a second input size too (``verify.second_size``: such a width may
    also be read as a number, such a weight computed from the input's size). Where it fails and
    other integer widths were set (the forward reads some as fixed sizes, not as the widths they
    matched), those of the module the check blames (and of modules inside it) are put back while
    that makes it pass (``_blamed``), else each module's tried in turn (``_settle``): at the
    example's size (a check of two sizes for each made a TinyViT's prune 7x the peer's); then the
    whole at both sizes, else with none of them."""
    # a baked weight may also be computed from the input's size (a Python number): another size shows it
    smaller = second_size(model, example) if any(c.sure for c in result.widths) or result.baked else None

    def quick() -> float:
        diff = check(model, result, example, output_transform=output_transform)
        return max(diff, _on_images(model, result, example, output_transform)) if result.value_reads else diff

    def test() -> float:
        return max(quick(), check(model, result, smaller, output_transform=output_transform)
                   if smaller is not None else 0.0)
    try:
        return test()
    except GraphError as e:
        if not any(not c.sure for c in result.widths):
            raise
        error = e
    widths = list(result.widths)
    if not _blamed(result, quick, error):
        _set(result, [c for c in widths if not c.sure], new=False)
        quick()  # wrong whatever the widths: the GraphError stands
        _settle(result, quick)
    try:
        return test()
    except GraphError:
        if smaller is None:
            raise
    _set(result, [c for c in widths if not c.sure], new=False)  # none kept: they failed at the second size
    result.widths = [c for c in widths if c.sure]
    return test()


def _on_images(model: nn.Module, result: PruneResult, example, output_transform=None) -> float:
    """The check on images in [0, 1], for a forward that reads values computed from its input
    (``if x.mean() > 0.3``): the path normal noise takes may not be the one images take."""
    try:
        return check(model, result, example, output_transform=output_transform, images=True)
    except GraphError as e:
        where = ", ".join(n or "the model's forward" for n in result.value_reads[:3])
        raise named(GraphError(f"{first_line(e, 200)} (on images in [0, 1], not on noise: {where} reads "
                               "values of its input, and images take a path noise does not)"),
                    getattr(e, "module", None) or "the model") from None


def _set(result: PruneResult, changes, new: bool) -> None:
    for c in changes:
        setattr(result.model.get_submodule(c.module), c.attr, c.new if new else c.old)


def _leave(result: PruneResult, left: list[WidthChange], why: str) -> None:
    """``left`` (put back by the caller) out of ``result.widths``, named in one warning."""
    result.widths = [c for c in result.widths if c not in left]
    names = ", ".join(f"{c.module}.{c.attr}" if c.module else c.attr for c in left[:6])
    warnings.warn(f"{len(left)} integer attribute(s) left as they were ({why}): {names}", stacklevel=5)


def _blamed(result: PruneResult, test: Callable[[], object], error: GraphError, most: int = 8) -> bool:
    """Put back the integer widths (not the sure ones) of the module ``error`` names and of the
    modules inside it, and test again, while the check blames a module with such widths (at
    most ``most`` times); True once it passes (the widths put back named in one warning), False
    where the blame names no such module (nothing put back is left so)."""
    left, back = [c for c in result.widths if not c.sure], []
    for _ in range(most):
        at = getattr(error, "module", None)
        blamed = [c for c in left if at is not None and (c.module == at or c.module.startswith(at + "."))]
        if not blamed:
            break
        _set(result, blamed, new=False)
        left, back = [c for c in left if c not in blamed], back + blamed
        try:
            test()
        except GraphError as e:
            error = e
            continue
        _leave(result, back, "the forward reads them as fixed sizes")
        return True
    _set(result, back, new=True)
    return False


def _settle(result: PruneResult, test: Callable[[], object], most: int = 16,
            keep: Callable[[WidthChange], bool] | None = None) -> None:
    """Put every integer width ``update_widths`` set back but the sure ones (a depthwise
    filter's groups, an attention's number of heads: they must follow their channels), then
    set each module's again where ``test`` (the check) still passes with it, for at most
    ``most`` modules; ``keep``: the changes kept without asking (with ``verify=False``, the
    sure ones only). Says which stay as they were."""
    by_module: dict[str, list] = {}
    for change in result.widths:
        by_module.setdefault(change.module, []).append(change)
    kept = [c for c in result.widths if c.sure]  # a depthwise filter's groups, a number of heads
    _set(result, [c for c in result.widths if not c.sure], new=False)
    if keep is not None:
        kept = [c for c in result.widths if keep(c)]
        _set(result, kept, new=True)
        why = "verify=False: only the check vouches for them"
    else:
        for changes in list(by_module.values())[:most]:
            changes = [c for c in changes if not c.sure]
            _set(result, changes, new=True)
            try:
                test()
                kept += changes
            except Exception:  # noqa: BLE001 (this module's widths break the forward: back)
                _set(result, changes, new=False)
        why = "the forward reads them as fixed sizes"
    _leave(result, [c for c in result.widths if c not in kept], why)


def _bn_names(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(name, bn) for name, bn in model.named_modules()
            if isinstance(bn, nn.modules.batchnorm._BatchNorm)]


@dataclass
class Plan:
    """A model's channel groups, scored (``scores``, one vector per group), and ``build``: the
    pruned network for keep-masks of those groups (with the threshold and the guarded groups'
    indices, which it only records)."""

    scores: list[torch.Tensor]
    build: Callable[[list[torch.Tensor], float | None, list[int]], PruneResult]
    sized: list[str] = field(default_factory=list)  # modules whose block or split sizes were followed
    # a traced plan's per-module keep-masks for group masks, without building (``surgery.plan``):
    # what a latency budget's probe reads widths off
    cuts: Callable[[list[torch.Tensor]], dict] | None = None


def _family_plan(model: nn.Module, importance: Importance) -> Plan:
    """The paper's way: one group per prunable BN, rebuilt as ``Net(cfg)`` on the meta device."""
    prunable = scaled_prunable_bns(model)
    bns = _bn_names(model)
    names = {id(bn): name for name, bn in model.named_modules()}
    scores = [_scores(importance, model, Group(bn.num_features, [], [(names[id(bn)], 0, 0, bn.num_features)]))
              for bn in prunable]

    def build(masks, threshold, guarded) -> PruneResult:
        by_layer = {id(bn): m for bn, m in zip(prunable, masks)}
        cfg_mask = [by_layer.get(id(bn), torch.ones(bn.num_features, dtype=torch.bool)) for _, bn in bns]
        cfg = model.pruned_cfg([int(m.sum()) for m in masks])
        new = models.build(model.arch, cfg=cfg, empty=True, **model.options)
        layers = SURGERY[models.family(model.arch).surgery](model, new, cfg_mask)
        new.train(model.training)
        return PruneResult(new, cfg, cfg_mask, threshold, [name for name, _ in bns],
                           [names[id(prunable[i])] for i in guarded], layers=layers,
                           ranked=(sum(len(m) for m in masks), sum(int((~m).sum()) for m in masks)))

    return Plan(scores, build)


def _as_family(model: nn.Module, result: PruneResult) -> None:
    """A shipped family cut along its traced graph (``surgery="graph"``, ``ignore=``): its cfg
    in the family's own form, where ``Net(cfg)`` rebuilds exactly the network the cut made (VGG,
    NIN), so that its checkpoint loads as the family's; else the per-BatchNorm dict stays."""
    prunable = {id(bn) for bn in scaled_prunable_bns(model)}
    widths = [int(result.masks[name].sum()) for name, bn in _bn_names(model) if id(bn) in prunable]
    try:
        cfg = model.pruned_cfg(widths)
        built = models.build(model.arch, cfg=cfg, empty=True, **model.options)
    except Exception:  # noqa: BLE001 (a cut the family's cfg cannot say)
        return
    mine = {k: v.shape for k, v in result.model.state_dict().items()}
    if mine == {k: v.shape for k, v in built.state_dict().items()}:
        result.cfg = result.model.cfg = cfg


def _block_of(model: nn.Module, name: str | None) -> type | None:
    """The type of the innermost module at or above ``name`` that is not one of torch's own
    (an attention block, not its ``nn.Linear``); None for the model itself or a name it lacks."""
    while name:
        try:
            module = model.get_submodule(name)
        except AttributeError:
            return None
        if not type(module).__module__.startswith("torch."):
            return type(module)
        name = name.rpartition(".")[0]
    return None


def _traced_plan(model: nn.Module, importance: Importance, example, ignore, keep_whole=(),
                 follow_sizes: bool = False, output_transform=None) -> Plan:
    """Any network: trace its channel graph once, score the free channels of each prunable
    group; ``build`` puts the pinned channels back, evens out the equal-count blocks (grouped
    convolutions, chunks) and cuts a copy along the graph."""
    factors = [(name, m) for name, m in model.named_modules() if is_factor_layer(m)]
    if not factors:
        raise SlimmingError("the model has no BatchNorm, GroupNorm or LayerNorm: there is nothing to slim "
                            "(network slimming scores channels by their scaling factors)")
    graph = trace(model, example, ignore, keep_whole, follow_sizes, output_transform)
    stuck = [n for n in graph.unbaked if isinstance(model.get_submodule(n)._modules.get(GATE), ChannelGate)]
    if stuck:  # folded after the check, the gate would scale columns its layer standardises again
        raise GraphError(f"{stuck[0]} computes its weight and does more than convolve with it: a gate there "
                         "cannot be folded in; remove it (add_gates puts none there)")
    kept_whole = ignored_names(model, ignore)  # their integer attributes are theirs too
    everything = graph.groups()
    groups = [g for g in everything if g.prunable]
    if not groups:
        raise GraphError(nothing_to_cut(model, everything))
    scores = [_scores(importance, model, g) for g in groups]
    blocks = graph.blocks()
    whole_block_scores({graph.find(g.spaces[0]): s for g, s in zip(groups, scores)}, blocks)

    def roots_of(masks) -> dict:
        """The keep-mask of every space's root: the groups' free channels as ``masks`` say, the
        pinned ones kept, the equal-count blocks evened out."""
        roots = {graph.find(g.spaces[0]): torch.ones(g.size, dtype=torch.bool) for g in everything}
        ranks = {r: torch.full((len(m),), float("inf")) for r, m in roots.items()}
        for g, m, score in zip(groups, masks, scores):
            r, free = graph.find(g.spaces[0]), g.free()
            roots[r][free] = m
            ranks[r][free] = score[free]
        equalize(roots, ranks, blocks)
        return roots

    def build(masks, threshold, guarded) -> PruneResult:
        roots = roots_of(masks)
        plan = surgery.plan(graph, roots)
        new = surgery.cut(model, plan, graph)
        fold(new, set(graph.by_weight), multiply=False)  # gates whose layer's hooks never run
        widths = surgery.update_widths(new, graph, roots, skip=kept_whole)
        thinned(new)  # torch's MultiheadAttention whose widths the cut changed: run as slimming's
        cfg_mask = [plan.get(name, {}).get("channels", torch.ones(factor_width(m), dtype=torch.bool))
                    for name, m in factors]
        cfg = {name: int(k.sum()) for (name, m), k in zip(factors, cfg_mask)
               if not isinstance(m, ChannelGate)}  # folded away at the end
        new.cfg = cfg
        layers = {name: {k: v for k, v in m.items() if k in ("in", "out")} for name, m in plan.items()
                  if isinstance(model.get_submodule(name), (nn.Conv2d, nn.Linear))}
        ranked = (sum(int(g.free().sum()) for g in groups),
                  sum(int((~roots[graph.find(g.spaces[0])][g.free()]).sum()) for g in groups))
        return PruneResult(new, cfg, cfg_mask, threshold, [name for name, _ in factors],
                           [groups[i].bns[0][0] for i in guarded], layers=layers, widths=widths,
                           ranked=ranked, value_reads=sorted(set(graph.value_reads)),
                           baked={n: graph.computed[n] for n in baked_layers(new) if n in graph.computed})

    return Plan([s[g.free()] for g, s in zip(groups, scores)], build, sorted(set(graph.sized)),
                lambda masks: surgery.plan(graph, roots_of(masks)))


def nothing_to_cut(model: nn.Module, groups: list[Group]) -> str:
    """Why no channel of ``model`` can be cut: the reasons that kept its scored groups whole,
    the most common first."""
    counts: dict[str, int] = {}
    for g in groups:
        if g.bns:
            for why in g.reasons[:1]:
                counts[why] = counts.get(why, 0) + g.size
    reasons = sorted(counts, key=lambda w: -counts[w])
    said = "; ".join(f"{w} ({counts[w]} channels)" for w in reasons[:3]) \
        or "no scaling factor scores any channel"
    return f"no channel of {type(model).__name__} can be cut: {said}"
