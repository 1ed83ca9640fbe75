"""``slimming.add_gates``: a per-channel scaling factor (``slimming.models.gates``) where a width
has none, found by the trace or named by the user, and a gate per attention head."""

from __future__ import annotations

from torch import nn

from ..models.gates import attach, gated_layers
from ..utils.modules import unwrap
from .prune import default_example
from .trace import trace


def add_gates(model: nn.Module, example_inputs=None, *, at=None, ignore=(), heads: bool = True) -> list[str]:
    """Give ``model`` (in place) a gate of ones before each layer that reads a width nothing
    scores, so that sparsity training and ``prune`` can slim it; returns the names of the
    layers with a gate, in the model's order.

    ``at``: the layers (names) whose input channels get a gate. Without it, the trace (one
    forward of ``example_inputs``, default ``default_example``) finds them: a linear layer or a
    convolution of one group that alone reads every channel another such layer makes, where no
    BatchNorm, GroupNorm or LayerNorm scores them and nothing else keeps them (an MLP's hidden
    width: ``fc1 -> GELU -> fc2`` gets a gate before ``fc2``). ``ignore``: as ``prune`` takes it.
    A layer with a gate keeps it. At the cut the gates fold into those layers and disappear.

    ``heads`` (default): also a gate per attention head (``HeadGate``) before each layer that
    reads an attention's heads merged (its output projection), where the trace follows the
    heads (the module holds their number, ``num_heads``, and splits a layer's output into
    them); ``prune`` then cuts heads whole and sets ``num_heads``."""
    model = unwrap(model)
    if at is not None:
        attach(model, [at] if isinstance(at, str) else list(at))
        return _gated(model)
    graph = trace(model, default_example(model) if example_inputs is None else example_inputs, ignore)
    readers: dict[int, list] = {}
    per_head: dict[str, int] = {}
    for use in graph.uses:
        if use.kind.endswith("_in"):
            m = graph.resolve(use.map)
            for r in {graph.find(s.space) for s in m.segs}:
                readers.setdefault(r, []).append((use.module, use.kind, m))
            found = graph.heads_of(use.map) if heads and use.kind in ("linear_in", "conv_in") else None
            if found is not None and getattr(model.get_submodule(use.module), "groups", 1) == 1:
                per_head[use.module] = found[1]
    chosen = []
    for g in graph.groups():
        found = readers.get(graph.find(g.spaces[0]), [])
        if g.bns or len(found) != 1:
            continue
        name, kind, m = found[0]
        whole = len(m.segs) == 1 and m.segs[0].start == 0 and m.segs[0].length == g.size and m.factor == 1
        layer = model.get_submodule(name)
        # kept only for want of a factor, or because this very layer reads them first: a gate
        # here gives them one (a Reason says what it is, not only how it reads)
        unscored = all(getattr(why, "kind", None) == "unscored"
                       or (getattr(why, "kind", None) == "read_first" and why.module == name)
                       for why in g.reasons)
        if whole and kind in ("linear_in", "conv_in") and getattr(layer, "groups", 1) == 1 and unscored:
            chosen.append(name)
    attach(model, chosen)
    attach(model, {name: n for name, n in per_head.items() if name not in chosen}, heads=True)
    return _gated(model)


def _gated(model: nn.Module) -> list[str]:
    """Every layer with a gate (per channel or per head), in the model's order."""
    gated = {**gated_layers(model), **gated_layers(model, heads=True)}
    return [name for name, _ in model.named_modules() if name in gated]
