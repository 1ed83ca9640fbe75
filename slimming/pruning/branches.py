"""Branches a cut may empty, and the layers that then compute nothing or a constant.

The paper's cut keeps every layer at ``min_channels`` at least, so that the network stays
connected. A width inside a residual branch (the channels between where the branch leaves the
residual stream and where it is added back) needs no such guard: with all of them cut, the
stream still carries the input to the output, and the branch adds what it still emits, a
constant per channel (the BatchNorm's beta after a zero input) or nothing.

``removable`` says which groups may so be emptied: every channel free (none pinned), every
layer that makes, carries or reads them one that ``slimming.layers.removed`` can replace (a
torch convolution or linear layer, a norm, a gate, a layer scale), and the network's outputs
still reached from its inputs along the layers of the channel graph without passing through
the group (a chain's width is never one: cutting it whole would cut the network in two). An
attention's heads are one such width, with every head's channels: all of them cut, its
projections are replaced and its own forward runs on no heads (where it cannot, a reshape
that infers a head's width, the check's run fails and that block keeps its branches).
``remove`` replaces, in the cut copy, the layers such a cut emptied (``Emptied``) and the
layers that read only emptied channels (``Constant``: their bias); ``unread`` then empties
the layers whose output only those read (a bottleneck's first 1x1, the norm before an emptied
attention), by one forward of the cut copy; together, ``PruneResult.removed``. ``prune``'s
check then holds the result to the original with the cut channels zeroed, as every cut is.
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import nn

from ..layers.removed import NORMS, Constant, Emptied, channel_dim, removable_layer, replace
from ..layers.rules import factor_width, is_layer, layer_kind
from .capture import Call, CaptureError, capture
from .graph import ChannelGraph, Group, Map, Side, Use
from .ops import META_OPS, VALUE_OPS, in_place, leaves, op_name, tensors

OUTPUT = "the model's output"  # the trace's pins (trace.Walk.run)
REMOVED = (Emptied, Constant)
# the uses an emptied group may have
KINDS = ("conv", "depthwise", "linear", "gate", "head_gate", "scale", *NORMS)


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
    inside = _inside_heads(graph)
    headed = set().union(*inside.values())
    found = {}
    for i, g in enumerate(groups):
        r = graph.find(g.spaces[0])
        if (g.pinned is not None and bool(g.pinned.any())) or r in sources or r in sinks \
                or (r in headed and r not in inside):
            continue
        avoid = {r} | inside.get(r, set())  # an attention's heads: their channels too
        uses = [use for a in avoid for use in touching[a]]
        if all(_can_go(graph, use) for use in uses) and _reaches(edges, sources, sinks, avoid) \
                and (r not in inside or _within_attention(graph, r, uses)):
            found[i] = {use.module for use in uses}
    return found


def _inside_heads(graph: ChannelGraph) -> dict[int, set[int]]:
    """{an attention's heads' space: its heads' channel spaces (each head's pieces of the
    queries, keys, values and merged output, and the channels tied in every head)}."""
    inside: dict[int, set[int]] = {graph.find(space): {graph.find(space)}
                                   for space, _ in graph.head_modules.values()}
    for piece, (space, _) in [*graph.piece_head.items(), *graph.heads.items()]:
        inside.setdefault(graph.find(space), {graph.find(space)}).add(graph.find(piece))
    return {r: spaces - {r} for r, spaces in inside.items()}


def _within_attention(graph: ChannelGraph, heads: int, uses: list[Use]) -> bool:
    """Whether every layer making or reading an attention's heads is inside the block that
    holds the one module holding their number (timm's ``Attention``; Hugging Face's self
    attention and its output projection's module, side by side), which then runs on no heads."""
    names = [name for name, (space, _) in graph.head_modules.items() if graph.find(space) == heads]
    if len(names) != 1:
        return False
    block = names[0].rpartition(".")[0]
    return all(use.module.startswith(block + ".") for use in uses) if block else True


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
    layer = graph.model.get_submodule(use.module)
    return use.kind in ("gate", "head_gate", "scale") or removable_layer(layer, use.kind)


def _reaches(edges: dict[int, set[int]], sources: set[int], sinks: set[int], avoid: set[int]) -> bool:
    """Whether a sink is reached from a source along ``edges`` without entering ``avoid``."""
    seen = set(sources) - avoid
    todo = list(seen)
    while todo:
        a = todo.pop()
        if a in sinks:
            return True
        for b in edges.get(a, ()):
            if b not in avoid and b not in seen:
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
        if kind is None or kind in ("gate", "head_gate"):
            continue
        made = [m for key, m in keep.items() if key in ("out", "channels")]
        if made and not any(bool(m.any()) for m in made):
            removed[name] = Emptied(new.get_submodule(name))
        elif "in" in keep and not bool(keep["in"].any()) and kind in ("conv", "linear"):
            layer = new.get_submodule(name)
            removed[name] = Constant(layer, layer.bias)
    for name in reversed(_in_model_order(new, removed)):  # the innermost first: a layer inside another
        replace(new, name, removed[name])
    return {name: type(removed[name]).__name__ for name in _in_model_order(new, removed)}


def _in_model_order(model: nn.Module, names) -> list[str]:
    """``names`` (modules of ``model``) in the order ``named_modules`` gives them."""
    order = {name: i for i, (name, _) in enumerate(model.named_modules())}
    return sorted(names, key=order.get)


def unread(new: nn.Module, inputs: tuple, removed: dict[str, str]) -> dict[str, str]:
    """In ``new`` (the cut copy, ``removed`` what ``remove`` replaced), every layer whose output
    only reaches the layers replaced, whose values are so never read (the norm before an emptied
    attention, a ConvNeXt block's depthwise convolution and norm before its emptied MLP, a
    bottleneck's first 1x1 before its emptied 3x3), made ``Emptied`` too; found by one forward
    of ``inputs`` (``Readers``). Returns ``removed`` with them, in model order. The replaced
    layers read their input's positions only, which an ``Emptied`` keeps, so the rest computes
    what it computed; what else meets their output (an op, a layer that stays) must run on no
    channels, or is kept."""
    readers, training = Readers(), new.training
    try:
        out = capture(new, inputs, [readers], leaf=lambda m: is_layer(m) or isinstance(m, REMOVED))
    except CaptureError:  # the removal does not run: the check's run says where, and keeps those branches
        return removed
    finally:
        new.train(training)
    outputs = [readers.made[id(t)] for t in leaves(out) if id(t) in readers.made]
    if not outputs:
        return removed
    read = readers.read_from(outputs)
    takers: dict[int, list[int]] = defaultdict(list)  # node -> the nodes given what it made
    for node, deps in enumerate(readers.deps):
        for d in deps:
            takers[d].append(node)
    for node, d in readers.shape_of:
        takers[d].append(node)
    layers = {node: new.get_submodule(name) for node, name in readers.layers.items()}
    replaced = {node for node, layer in layers.items() if isinstance(layer, REMOVED)}
    can = {node for node, layer in layers.items() if _empties(layer, readers.shapes[node])}
    empty: set[int] = set()
    for node in reversed(range(len(readers.deps))):  # what takes a node's output ran after it
        given = takers[node]
        if node not in read and (node in can or node not in readers.layers) and given \
                and all(t in empty or t in replaced for t in given):
            empty.add(node)
    calls: dict[str, list[int]] = defaultdict(list)
    for node, name in readers.layers.items():
        calls[name].append(node)
    found = {name: Emptied(layers[nodes[0]]) for name, nodes in calls.items()
             if all(n in empty and n in can for n in nodes)}
    for name, layer in found.items():
        replace(new, name, layer)
    both = {**removed, **{name: "Emptied" for name in found}}
    return {name: both[name] for name in _in_model_order(new, both)}


def _empties(layer: nn.Module, shapes: list[torch.Size]) -> bool:
    """Whether ``Emptied(layer)`` gives what ``layer`` gave (``shapes``) with no channels: a
    torch convolution or linear layer by its geometry, a norm where its channels are the one
    dimension ``Emptied`` narrows, and uniquely so at this shape (a LayerNorm over more
    dimensions is not)."""
    kind = layer_kind(layer)
    if kind is None or not removable_layer(layer, kind) or len(shapes) != 1:
        return False
    if kind not in NORMS:
        return True
    shape, width = shapes[0], factor_width(layer)
    dim = channel_dim(layer) % len(shape) if len(shape) >= 2 else None
    return dim is not None and len(getattr(layer, "normalized_shape", (width,))) == 1 \
        and [d for d in range(1, len(shape)) if shape[d] == width] == [dim]


class Readers:
    """One forward as nodes: each call of a layer (followed whole) and each torch call outside
    layers, linked to the nodes that made its tensor inputs (an in-place op of one tensor, a
    ``relu_``, makes that tensor anew). Read by themselves: the calls that give Python values
    (``item``, ``bool``, anything but a tensor or a shape) and the in-place ops of several
    tensors (``add_``, ``copy_``, ``__setitem__``), which may write into a tensor others see;
    ``read_from`` adds every node those and the outputs depend on. ``Emptied`` and ``Constant``
    depend on nothing, they read their input's positions only (``shape_of``: (that layer's
    node, the node that made its input))."""

    def __init__(self):
        self.made: dict[int, int] = {}  # id(tensor) -> the node that last wrote it
        self.deps: list[list[int]] = []
        self.layers: dict[int, str] = {}  # node -> the layer it called
        self.shapes: dict[int, list[torch.Size]] = {}  # a layer's node -> the shapes it made
        self.by_itself: list[int] = []
        self.shape_of: list[tuple[int, int]] = []
        self.alive: list[torch.Tensor] = []  # every tensor seen: its id stays its own
        self.depth = 0  # > 0 inside a layer

    def _made_by(self, given: list[torch.Tensor]) -> list[int]:
        return [self.made[id(t)] for t in given if id(t) in self.made]

    def _node(self, given: list[torch.Tensor], made: list[torch.Tensor]) -> int:
        self.deps.append(self._made_by(given))
        for t in made:
            self.made[id(t)] = len(self.deps) - 1
        self.alive += given + made
        return len(self.deps) - 1

    def enter(self, name: str, module: nn.Module, args: tuple) -> None:
        self.depth += is_layer(module) or isinstance(module, REMOVED)

    def leave(self, name: str, module: nn.Module, args: tuple, out) -> None:
        if not (is_layer(module) or isinstance(module, REMOVED)):
            return
        self.depth -= 1
        if self.depth:  # a layer inside a layer is its outer one's business
            return
        shape_only = isinstance(module, REMOVED)
        made_by = self._made_by(tensors(args))
        node = self._node([] if shape_only else tensors(args), tensors(out))
        self.layers[node], self.shapes[node] = name, [t.shape for t in tensors(out)]
        if shape_only:
            self.shape_of += [(node, d) for d in made_by]

    def call(self, call: Call) -> None:
        name = op_name(call.func)
        if name in META_OPS or self.depth:
            return None
        given, made = tensors([*call.args, *call.kwargs.values()]), tensors(call.out)
        node = self._node(given, made)
        if name in VALUE_OPS or not made or (in_place(call.func, call.args, call.kwargs, call.out)
                                             and len(given) > 1):
            self.by_itself.append(node)
        return None

    def read_from(self, outputs: list[int]) -> set[int]:
        """The nodes read: ``outputs``, those read by themselves, and what they depend on."""
        read, todo = set(), [*outputs, *self.by_itself]
        while todo:
            node = todo.pop()
            if node not in read:
                read.add(node)
                todo += self.deps[node]
        return read
