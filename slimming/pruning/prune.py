"""``slimming.prune``: which channels go together, which to cut, and how to cut them.

"Which go together": for a registered family, each prunable BatchNorm alone (the paper's); for
any other network, the groups of its traced channel graph (``graph``). Both are a ``Plan``
(``plans``): the groups, scored by an importance criterion (``importance``; network slimming's
|gamma| by default), and how to build the pruned network for keep-masks of them. "Which to cut"
is architecture-free: one global threshold (``select``) or a budget (``budget``, ``speed``) over
those scores. "How": any other network is cut along its graph; a family is rebuilt as
``Net(cfg)`` and filled by the surgery its class declares (both in ``surgery``). The traced path
on VGG and NIN gives the same channels and outputs as their surgery (tested): each checks the
other. Then ``repair`` folds what the cut channels still gave into the layers that read them.

``prune`` itself is a pipeline of named steps (``_Steps``): ``checked_cut`` plans, cuts (``_cut``:
by share, threshold or budget), vouches (``_vouch``: the check with the integer widths the cut
set, ``widths.checked``, or with ``verify=False`` one run of the pruned network), and where that
refuses, keeps what failed (``_retry``: the heads and size splits, then a block's type, at most
three) and cuts again, each refusal a ``Retry`` in ``result.retries``; ``settle`` gives a traced
family its cfg, warns, compensates and folds the gates away. What it returns, ``PruneResult``,
is in ``records``.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from .. import models
from ..errors import SlimmingError, clip, first_line, listed, number
from ..layers.gates import fold
from ..utils import progress
from ..utils.modules import eager_model, modes_kept
from . import branches, budget, estimate, plans, repair, speed, widths
from .amount import Amount
from .configs import said_widths
from .graph import GraphError, ignored_names
from .importance import DEFAULT, Importance, get_importance
from .notes import gates_held, little_sparsity, nearly_emptied
from .records import PruneResult
from .select import select
from .trace import as_inputs, positional
from .verify import runs


def default_example(model: nn.Module) -> torch.Tensor:
    """One image of the size the model takes: its ``input_size`` (C, H, W) when it has one
    (every family declares one; slimming's builders set one), else 3x224x224."""
    size = getattr(model, "input_size", None) or (3, 224, 224)
    return torch.zeros(1, *size, device=next(model.parameters()).device)


def _outside_inference_mode(fn: Callable) -> Callable:
    """``fn`` run with inference mode off: under ``torch.inference_mode()`` the tensors it makes
    cannot go into a new network ("Inference tensors do not track version counter")."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        with torch.inference_mode(False):
            return fn(*args, **kwargs)
    return run


@_outside_inference_mode
def prune(model: nn.Module, percent: float | None = None, threshold: float | None = None,
          min_channels: int = 1, *, importance: Importance | str | None = None,
          example_inputs: torch.Tensor | None = None, ignore=(),
          surgery: str = "auto", target_flops: float | None = None,
          target_params: float | None = None, round_to: int | str | None = None, max_layer_prune: float = 1.0,
          compensate: bool = True, keep_whole=(), verify: bool = True,
          target_latency: float | str | None = None, latency_model=None,
          cut_heads: bool = True, output_transform: Callable | None = None,
          check_inputs=None, remove_branches: bool = True) -> PruneResult:
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
    may keep more. ``remove_branches`` (default): a traced network's residual branch whose
    width is cut whole is removed, not kept at ``min_channels``: its layers become what they
    still compute, nothing or a constant (``slimming.pruning.branches``; ``result.removed``).

    ``importance`` scores channels: an ``Importance`` or the name of one (default ``"bn-max"``:
    |gamma|, the largest over a group's BatchNorms). A registered family (NIN, VGG,
    pre-activation ResNet, DenseNet, yours) is cut by its own surgery, as the paper does; any
    other network (or any, with ``surgery="graph"``) is traced on ``example_inputs`` (default:
    one image of ``default_example``'s size; a tuple for a forward of several inputs, or a dict
    of its keyword arguments, ``{"sample": x, "timestep": t}``) and cut
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
    those features are cut where their producers are and the check compares ``y``.
    ``check_inputs``: real inputs the check also compares on (a batch, or a list of batches;
    each a tuple for a forward of several inputs), for a forward whose path depends on value
    ranges neither the check's noise nor its images in [0, 1] reach (raw 0-255 images, dark
    ones after normalisation). The original
    model is left untouched (every module's train/eval flag too); the new one is on the same
    device, each module in the mode it had.
    """
    model = eager_model(model, "prune")
    importance = _criterion(importance)
    if surgery not in ("auto", "graph"):
        raise SlimmingError(f"surgery must be 'auto' or 'graph', got {surgery!r}", param="surgery")
    amount = Amount.of(percent, threshold, target_flops, target_params, target_latency)  # read once, here
    if round_to is None:  # the paper's exact widths, or under a latency budget widths that run fast
        round_to = ROUND_FOR_SPEED if amount.kind == "target_latency" else 1
    _check_arguments(round_to, output_transform, cut_heads, latency_model, amount, remove_branches)
    checks = _check_batches(check_inputs, verify)
    example = default_example(model) if example_inputs is None else positional(model, example_inputs)
    # ignore / keep_whole on a shipped family: its own surgery knows no such thing, the traced
    # path does (and gives the family's own channels where nothing is ignored: tested)
    traced = surgery == "graph" or models.family(getattr(model, "arch", None)) is None \
        or bool(ignored_names(model, ignore) | ignored_names(model, keep_whole))
    whole = (keep_whole,) if isinstance(keep_whole, (str, type)) else tuple(keep_whole or ())
    limits = dict(min_channels=min_channels, round_to=round_to, max_layer_prune=max_layer_prune)
    steps = _Steps(model, importance, example, traced, ignore, whole, verify, limits, amount, latency_model,
                   output_transform, checks, remove_branches)
    with modes_kept(model), progress.steps("prune"):  # a bar naming each step, on a terminal
        result = steps.checked_cut(follow_sizes=traced and cut_heads)
        steps.settle(result, compensate)
    if isinstance(example, torch.Tensor):  # save_pruned keeps it: load_pruned's forward
        result.model._slimming_example_shape = tuple(example.shape)
    return result


ROUND_FOR_SPEED = 8  # round_to's default under a latency budget (benchmarks/RESULTS.md, "Latency", widths)


def _check_batches(check_inputs, verify: bool) -> tuple:
    """``check_inputs`` as a tuple of batches (each the forward's inputs, a tuple); None: none.
    SlimmingError for what holds no tensor, or with ``verify=False`` (nothing would check)."""
    if check_inputs is None:
        return ()
    if isinstance(check_inputs, torch.Tensor):
        check_inputs = [check_inputs]
    batches = [as_inputs(b) for b in check_inputs] if isinstance(check_inputs, (list, tuple)) else None
    if not batches or not all(any(isinstance(t, torch.Tensor) for t in b) for b in batches):
        raise SlimmingError(f"check_inputs takes a batch of real inputs (a tensor) or a list of them, not "
                            f"{clip(repr(check_inputs), 80)}", param="check_inputs")
    if not verify:
        raise SlimmingError("check_inputs are what the check compares on: give verify=True with them",
                            param=("check_inputs", "verify"))
    return tuple(batches)


def _check_arguments(round_to, output_transform, cut_heads, latency_model, amount: Amount,
                     remove_branches: bool = True) -> None:
    """What else prune refuses before any work (beside a surgery it does not know and an amount
    it cannot read, ``Amount.of``): a round_to that is no width, an output_transform that is no
    function, a cut_heads or remove_branches that is no bool ('no' is true), a latency_model that is none (a
    class, a device name) or that nothing would use."""
    if round_to != "auto":
        number(round_to, "round_to", integer=True, low=1)
    for flag, name in ((cut_heads, "cut_heads"), (remove_branches, "remove_branches")):
        if not isinstance(flag, bool):
            raise SlimmingError(f"{name} takes True or False, not {clip(repr(flag))}", param=name)
    if latency_model is not None:
        if isinstance(latency_model, type) or not all(callable(getattr(latency_model, a, None))
                                                      for a in ("layer", "network")):
            got = f"the class {latency_model.__name__}" if isinstance(latency_model, type) \
                else clip(repr(latency_model))
            raise SlimmingError(f"latency_model takes what times layers and networks (an instance: "
                                f"MeasuredLatency('cpu')), not {got}", param="latency_model")
        if amount.kind != "target_latency" and round_to != "auto":
            raise SlimmingError("latency_model times a latency budget or round_to='auto': give "
                                "target_latency or round_to='auto' with it, or leave it out",
                                param="latency_model")
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
    amount: Amount
    latency_model: object = None
    output_transform: Callable | None = None
    check_inputs: tuple = ()
    remove_branches: bool = True

    def checked_cut(self, follow_sizes: bool) -> PruneResult:
        """Plan, cut, check until the check passes; what was retried is in ``result.retries``."""
        kept, retries, whole_branches = (), [], ()  # whole_branches: where branches stay (prefixes)
        while True:
            again = f" (try {len(retries) + 1})" if retries else ""
            progress.at(("trace" if self.traced else "plan") + again)
            if self.traced:
                plan = plans.traced_plan(self.model, self.importance, self.example, self.ignore,
                                         self.whole, follow_sizes, self.output_transform, kept,
                                         self.check_inputs)
                plan.removable = {} if not self.remove_branches else branches.outside(plan.removable,
                                                                                       whole_branches)
            else:
                plan = plans.family_plan(self.model, self.importance)
            progress.at("cut" + again)
            result = _cut(self.model, plan, self.example, self.limits, self.amount, self.latency_model)
            progress.at(("check" if self.verify else "run") + again)
            failure = _vouch(self.model, result, self.example, self.verify, self.output_transform,
                             self.check_inputs)
            if failure is None:
                result.retries = retries
                if note := gates_held(self.model, plan, result):
                    warnings.warn(note, stacklevel=3)
                return result
            retry = _retry(self.model, failure, plan, follow_sizes, kept, self.traced, self.verify,
                           result.removed, whole_branches)
            warnings.warn(str(retry), stacklevel=3)
            retries.append(retry)
            if retry.kept == "branches":
                whole_branches = (*whole_branches, retry.modules[0])
            elif retry.kept == "sizes":
                follow_sizes = False
            else:
                kept = (*kept, retry.block)

    def settle(self, result: PruneResult, compensate: bool) -> None:
        """A family's cfg for a traced family, the warnings a cut deserves, compensation, the
        gates (``slimming.add_gates``) folded into the layers they feed, and a Hugging Face
        model's config set to the widths it can say (``configs``)."""
        if self.traced and models.family(getattr(self.model, "arch", None)) is not None:
            plans.as_family(self.model, result)
        for note in (little_sparsity(self.model, result), nearly_emptied(result)):
            if note:
                warnings.warn(note, stacklevel=3)
        if compensate:
            progress.at("compensate")
            result.compensation = repair.compensate(self.model, result, self.example,
                                                    output_transform=self.output_transform)
        fold(result.model)  # gates into the layers they feed: no extra module
        if note := said_widths(self.model, result.model, self.example):  # a Hugging Face config
            warnings.warn(note, stacklevel=3)


@dataclass
class Retry:
    """A cut the check (or, with ``verify=False``, the run) refused, and what the next cut
    kept: ``kept`` "branches" (the branches inside the module named, "" the whole network, kept
    at ``min_channels``, not removed), "sizes" (the heads and size splits of the ``modules`` named) or "block"
    (every module of the type ``block``, named in ``modules``); ``why``: the failure, in one
    line; ``failed``: "match" (the check) or "run" (the unchecked run). ``str()``: the warning."""

    kept: str
    modules: list[str]
    why: str
    failed: str = "match"
    block: type | None = None

    def __str__(self) -> str:
        failed = f"cut, the network did not {self.failed} ({self.why})"
        if self.kept == "branches":
            where = f"inside {self.modules[0]}" if self.modules[0] else "of the network"
            return f"the branches {where} are kept at min_channels, not removed: {failed}"
        if self.kept == "sizes":
            return f"the channels of {listed(self.modules)} are kept: {failed}; its forward reads widths " \
                "the cut cannot set"
        return f"every {self.modules[0]} is kept whole: {failed}"


def _cut(model: nn.Module, plan, example, limits: dict, amount: Amount, latency_model) -> PruneResult:
    """The pruned network ``plan`` gives for the ``amount`` asked: a share or a threshold of the
    ranked channels (``select``), a FLOPs or parameter budget (``budget``), or a latency
    (``speed``). A budget's candidate that does not run is returned for the check to refuse."""
    inputs = as_inputs(example)
    if amount.kind == "target_latency":
        return speed.search(model, plan, inputs, amount, limits, latency_model, checked=True)
    cut_limits = dict(limits)
    if limits["round_to"] == "auto":  # this plan's groups' step widths
        cut_limits["round_to"] = estimate.step_widths(model, plan, inputs, latency_model, limits)
    if amount.what is not None:
        return budget.search(model, plan, example, amount, cut_limits, checked=True)
    percent, threshold = (amount.value, None) if amount.kind == "percent" else (None, amount.value)
    masks, cut_at, guarded = select(plan.scores, percent, threshold, removable=plan.removable, **cut_limits)
    return plan.build(masks, cut_at, guarded)


def _vouch(model: nn.Module, result: PruneResult, example, verify: bool,
           output_transform=None, check_inputs: tuple = ()) -> GraphError | None:
    """The check (``verify``: ``result.verified`` set) or, unchecked, one run of the pruned
    network with only its sure widths set; the GraphError where it refuses, else None."""
    try:
        if verify:
            result.verified = widths.checked(model, result, example, output_transform, check_inputs)
        else:
            if any(not change.sure for change in result.widths):
                widths.settle(result, lambda: None, keep=lambda change: change.sure)
            runs(result, example)
    except GraphError as e:
        return e
    return None


def _retry(model: nn.Module, failure: GraphError, plan, follow_sizes: bool, kept: tuple, traced: bool,
           verify: bool, removed: dict, whole_branches: tuple) -> Retry:
    """What to keep for the next cut after ``failure``: the sizes the plan followed, else the
    block (the type of the innermost module of the user's code) the failure names, for at most
    three blocks; the failure itself where there is nothing left to keep."""
    failed, why = "match" if verify else "run", first_line(failure, 160)
    if removed and "" not in whole_branches:  # a removed branch first: its block's branches kept
        where = _block_name(model, getattr(failure, "module", None)) or ""  # (none: the network's)
        return Retry("branches", [where if where not in whole_branches else ""], why, failed)
    if plan.sized and follow_sizes:
        return Retry("sizes", list(plan.sized), why, failed)
    block = _block_of(model, getattr(failure, "module", None))
    if not traced or block is None or block in kept or len(kept) >= 3:
        raise failure
    return Retry("block", [block.__name__], why, failed, block)


def _block_of(model: nn.Module, name: str | None) -> type | None:
    """The type of the innermost module at or above ``name`` that is not one of torch's own
    (an attention block, not its ``nn.Linear``); None for the model itself or a name it lacks."""
    block = _block_name(model, name)
    return None if block is None else type(model.get_submodule(block))


def _block_name(model: nn.Module, name: str | None) -> str | None:
    """The name of that module (``_block_of``); None for the model itself or a name it lacks."""
    while name:
        try:
            module = model.get_submodule(name)
        except AttributeError:
            return None
        if not type(module).__module__.startswith("torch."):
            return name
        name = name.rpartition(".")[0]
    return None


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
