"""Branches a cut may empty, and the layers that then compute nothing or a constant.

The paper's cut keeps every layer at ``min_channels`` at least, so that the network stays
connected. A width inside a residual branch (the channels between where the branch leaves the
residual stream and where it is added back) needs no such guard: with all of them cut, the
stream still carries the input to the output, and the branch adds what it still emits, a
constant per channel (the BatchNorm's beta after a zero input) or nothing.

``removable`` says which groups may so be emptied: every channel free (none pinned), every
layer that makes, carries or reads them one that ``slimming.layers.removed`` can replace (a
torch convolution or linear layer, a norm, a gate, a layer scale; no attention heads), and the
network's outputs still reached from its inputs along the layers of the channel graph without
passing through the group (a chain's width is never one: cutting it whole would cut the
network in two). ``remove`` replaces, in the cut copy, the layers such a cut emptied
(``Emptied``) and the layers that read only emptied channels (``Constant``: their bias), and
returns what it replaced (``PruneResult.removed``). ``prune``'s check then holds the result to
the original with the cut channels zeroed, as every cut is.
"""

from __future__ import annotations

from collections import defaultdict

from torch import nn

from ..layers.removed import NORMS, Constant, Emptied, removable_layer, replace
from .graph import ChannelGraph, Group, Map, Side, Use

OUTPUT = "the model's output"  # the trace's pins (trace.Walk.run)
KINDS = ("conv", "depthwise", "linear", "gate", "scale", *NORMS)  # the uses an emptied group may have


def _is_input(why: str) -> bool:
    return why == "the input image" or (why.startswith("input ") and why.endswith(" of the model"))


def removable(graph: ChannelGraph, groups: list[Group]) -> dict[int, set[str]]:
    """{index of a group of ``groups`` whose every channel may be cut (see the module's
    docstring): the modules that make, carry or read its channels}."""
    touching: dict[int, list[Use]] = defaultdict(list)
    edges: dict[int, set[int]] = defaultdict(set)
    sides: dict[str, dict[Side, set[int]]] = defaultdict(lambda: defaultdict(set))
    for use in graph.uses:
        roots = {graph.find(s.space) for s in graph.resolve(use.map).segs}
        for r in roots:
            touching[r].append(use)
        sides[use.module][use.side] |= roots
    for by_side in sides.values():
        for a in by_side[Side.IN]:
            edges[a] |= by_side[Side.OUT] - {a}
    sources: set[int] = set()
    sinks: set[int] = set()
    for seg, why in graph.pins:
        if why == OUTPUT or _is_input(why):
            roots = (graph.find(s.space) for s in graph.resolve(Map([seg])).segs)
            (sinks if why == OUTPUT else sources).update(roots)
    headed = {graph.find(s) for s in graph.piece_head} | {graph.find(r) for r in graph.heads} \
        | {graph.find(space) for space, _ in graph.head_modules.values()}
    found = {}
    for i, g in enumerate(groups):
        r = graph.find(g.spaces[0])
        if (g.pinned is not None and bool(g.pinned.any())) or r in headed or r in sources or r in sinks:
            continue
        if all(_can_go(graph, use) for use in touching[r]) and _reaches(edges, sources, sinks, r):
            found[i] = {use.module for use in touching[r]}
    return found


def outside(removable: dict[int, set[str]], kept: tuple[str, ...]) -> dict[int, set[str]]:
    """``removable`` without the groups any of whose modules is inside one of ``kept`` (module
    names; "" is the whole network): where a removal failed the check, branches are kept."""
    def inside(name: str) -> bool:
        return any(k == "" or name == k or name.startswith(k + ".") for k in kept)
    return {i: names for i, names in removable.items() if not any(inside(n) for n in names)}


def _can_go(graph: ChannelGraph, use: Use) -> bool:
    """Whether ``use`` leaves nothing the removal cannot replace."""
    if use.kind not in KINDS or use.module in graph.head_modules:
        return False
    return use.kind in ("gate", "scale") or removable_layer(graph.model.get_submodule(use.module), use.kind)


def _reaches(edges: dict[int, set[int]], sources: set[int], sinks: set[int], avoid: int) -> bool:
    """Whether a sink is reached from a source along ``edges`` without entering ``avoid``."""
    seen = set(sources) - {avoid}
    todo = list(seen)
    while todo:
        a = todo.pop()
        if a in sinks:
            return True
        for b in edges.get(a, ()):
            if b != avoid and b not in seen:
                seen.add(b)
                todo.append(b)
    return False


def remove(new: nn.Module, masks: dict, graph: ChannelGraph) -> dict[str, str]:
    """In ``new`` (the cut copy), every layer whose output channels the masks cut whole becomes
    ``Emptied``, every convolution or linear layer whose input channels they cut whole (and that
    still makes some) ``Constant``; returns {name: "Emptied" or "Constant"}, in model order.
    Gates are left: a gate of no channels multiplies nothing, and folds away with its reader."""
    kinds = {use.module: use.kind for use in graph.uses if use.kind != "scale"}
    removed = {}
    for name, keep in masks.items():
        kind = kinds.get(name)
        if kind is None or kind == "gate":
            continue
        made = [m for key, m in keep.items() if key in ("out", "channels")]
        if made and not any(bool(m.any()) for m in made):
            removed[name] = Emptied(new.get_submodule(name))
        elif "in" in keep and not bool(keep["in"].any()) and kind in ("conv", "linear"):
            layer = new.get_submodule(name)
            removed[name] = Constant(layer, layer.bias)
    order = {name: i for i, (name, _) in enumerate(new.named_modules())}
    for name in sorted(removed, key=lambda n: -order[n]):  # the innermost first: a layer inside another
        replace(new, name, removed[name])
    return {name: type(removed[name]).__name__ for name in sorted(removed, key=order.get)}
