"""``slimming.add_gates``: a per-channel scaling factor (``slimming.layers.gates``) where a width
has none, found by the trace or named by the user, and a gate per attention head."""

from __future__ import annotations

from torch import nn

from ..errors import SlimmingError, clip
from ..layers.gates import attach, gated_layers
from ..utils.modules import eager_model
from .graph import Side
from .prune import default_example
from .trace import positional, trace


def add_gates(model: nn.Module, example_inputs=None, *, at=None, ignore=(), heads: bool = True,
              everywhere: bool = False) -> list[str]:
    """Give ``model`` (in place) a gate of ones before each layer that reads a width nothing
    scores, so that sparsity training and ``prune`` can slim it; returns the names of the
    layers with a gate, in the model's order.

    ``at``: the layers (names) whose input channels get a gate. Without it, the trace (one
    forward of ``example_inputs``, default ``default_example``) finds them: a linear layer or a
    convolution of one group that alone reads every channel another such layer makes, where no
    BatchNorm, GroupNorm or LayerNorm scores them and nothing else keeps them (an MLP's hidden
    width: ``fc1 -> GELU -> fc2`` gets a gate before ``fc2``). ``ignore``: as ``prune`` takes it.
    A layer with a gate keeps it. At the cut the gates fold into those layers and disappear.

    ``everywhere``: a gate on every width nothing scores, for a network without normalisation
    (AlexNet, SqueezeNet, a VGG without BatchNorm, NFNets): before every linear layer or
    convolution of one group that reads such channels unflattened, also where several layers
    read them (SqueezeNet's two expand convolutions: a gate each, the channels scored by both)
    or read them beside others (a concatenation); the channels go where every gate on them is
    zeroed.

    ``heads`` (default): also a gate per attention head (``HeadGate``) before each layer that
    reads an attention's heads merged (its output projection), where the trace follows the
    heads (the module holds their number, ``num_heads``, and splits a layer's output into
    them); ``prune`` then cuts heads whole and sets ``num_heads``."""
    model = eager_model(model, "add_gates")
    if at is not None:
        names = list(at) if isinstance(at, (list, tuple, set, dict)) else [at]
        if not all(isinstance(n, str) for n in names):
            raise SlimmingError(f"add_gates: at takes layer names (a string or a list of them), not "
                                f"{clip(repr(at))}", param="at")
        attach(model, names)
        return _gated(model)
    example = default_example(model) if example_inputs is None else positional(model, example_inputs)
    traced = trace(model, example, ignore)
    graph, unfit = traced.graph, (*traced.coverage.by_weight, *traced.baked.unbaked)
    readers: dict[int, list] = {}
    per_head: dict[str, int] = {}
    for use in graph.uses:
        if use.side is Side.IN:
            m = graph.resolve(use.map)
            for r in {graph.find(s.space) for s in m.segs}:
                seen = readers.setdefault(r, [])
                if (use.module, use.kind, m) not in seen:  # met again by a training-mode forward: once
                    seen.append((use.module, use.kind, m))
            found = graph.heads_of(use.map) if heads and use.kind in ("linear", "conv") else None
            if found is not None and getattr(model.get_submodule(use.module), "groups", 1) == 1:
                per_head[use.module] = found[1]
    for name in unfit:  # called through its weight, never its forward: a
        per_head.pop(name, None)  # gate would not run; or computing its weight: a gate would not fold
    chosen = []
    for g in graph.groups():
        found = readers.get(graph.find(g.spaces[0]), [])
        # scored where a factor has a weight: a norm without affine (InstanceNorm's default) scores nothing
        scored = any(getattr(model.get_submodule(b.layer), "weight", None) is not None for b in g.bns)
        if scored or not found or (len(found) != 1 and not everywhere):
            continue
        names = {name for name, _, _ in found}
        # kept only for want of a factor, or because these very layers read them first: gates
        # there give them one (a Reason says what it is, not only how it reads)
        unscored = all(getattr(why, "kind", None) == "unscored"
                       or (getattr(why, "kind", None) == "read_first" and why.module in names)
                       for why in g.reasons)
        if unscored and all(_gateable(model, name, kind, m, g.size, everywhere)
                            and name not in unfit
                            for name, kind, m in found):
            chosen += [name for name in sorted(names) if name not in chosen]
    attach(model, chosen)
    attach(model, {name: n for name, n in per_head.items() if name not in chosen}, heads=True)
    return _gated(model)


def _gateable(model: nn.Module, name: str, kind: str, m, size: int, anywhere: bool) -> bool:
    """Whether a gate before layer ``name`` (reading map ``m``) can score a group of ``size``
    channels: a linear layer or a convolution of one group (transposed too: a UNet's decoder),
    reading them unflattened; all of
    its input that group alone, unless ``anywhere``."""
    whole = len(m.segs) == 1 and m.segs[0].start == 0 and m.segs[0].length == size
    return kind in ("linear", "conv", "convt") and getattr(model.get_submodule(name), "groups", 1) == 1 \
        and m.factor == 1 and (whole or anywhere)


def _gated(model: nn.Module) -> list[str]:
    """Every layer with a gate (per channel or per head), in the model's order."""
    gated = {**gated_layers(model), **gated_layers(model, heads=True)}
    return [name for name, _ in model.named_modules() if name in gated]
