"""How to cut a traced network, once the keep-masks of its channel groups are known.

``plan`` turns group masks into per-module masks through the channel graph: what a layer
reads (``in``), makes (``out``) or carries (``channels``: a BatchNorm, a depthwise convolution,
a layer scale); a linear layer after a flatten keeps ``factor`` columns per channel. ``cut``
applies the plan to a copy of the model, each layer by the rule of its kind
(``slimming.layers.rules``: which tensor follows which channels along which dim), and
``update_widths`` sets the integer attributes that held a width the cut changed.
(``slimming.layers.resize.resize_like`` is the way back: a freshly built network given a
pruned state_dict's widths.)
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import torch
from torch import nn

from ..layers.baked import bake
from ..layers.gates import ATTR as GATE
from ..layers.rules import RULES, ChannelGate, is_layer
from ..utils.modules import keep_slices
from .graph import ChannelGraph, GraphError, Map, ScaleSlot, Use, structure_copy
from .ops import HEAD_ATTRS


def plan(graph: ChannelGraph, group_masks: dict[int, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """{module name: {"in"/"out"/"channels": bool mask}} for every module the masks cut.
    ``group_masks`` maps a space's root (``graph.find``) to its keep-mask; groups absent
    from it keep every channel."""
    out: dict[str, dict[str, torch.Tensor]] = {}
    for use in graph.uses:
        mask = graph.mask_of(use.map, group_masks).repeat_interleave(use.map.factor)
        slot = out.setdefault(use.module, {})
        key = use.slot
        if key in slot and not torch.equal(slot[key], mask):  # the trace pins these (graph.pin_shared)
            raise GraphError(f"{use.module} is used twice on different channels; slimming cannot "
                             "cut a shared module two ways (list it in keep_whole=)")
        slot[key] = mask
    return {name: masks for name, masks in out.items() if not all(m.all() for m in masks.values())}


def cut(model: nn.Module, masks: dict[str, dict[str, torch.Tensor]], graph: ChannelGraph) -> nn.Module:
    """A copy of ``model`` with every module in ``masks`` cut to its kept channels by the rule
    of its kind (``slimming.layers.rules.RULES``): the very tensors the trace saw it use (a
    buffer used as a convolution's weight too), and its width attributes. The original is left
    untouched (no tensor is shared between the two). A layer whose forward computes its weight
    (``graph.computed``) is baked into the plain layer it ran first (``slimming.layers.baked``)."""
    new = structure_copy(model)
    how = {use.module: use for use in graph.uses if use.kind != "scale"}
    for name, weight in graph.computed.items():  # a weight its forward computes (standardised):
        m = new.get_submodule(name)  # baked where cut, or where a gate folds into it at the end
        if name in masks or isinstance(m._modules.get(GATE), ChannelGate):
            bake(m, weight)
    for name, keep in masks.items():
        m = new.get_submodule(name)
        for key, mask in keep.items():
            if isinstance(key, ScaleSlot):  # a per-channel parameter (layer scale), along its dim
                RULES["scale"].cut(m, {"channels": mask}, {"weight": key.attr}, key.dim)
        use = how.get(name)
        if use is not None:
            RULES[kind_of(use)].cut(m, keep, use.attrs, use.groups)
    for name, heads in head_masks(graph, masks).items():  # per-head tensors of an attention cut by heads
        m = new.get_submodule(name)
        for key, p in list(m._parameters.items()):  # its own (a relative position bias table)
            if p is not None and p.is_floating_point() and p.shape.count(len(heads)) == 1:
                m._parameters[key] = nn.Parameter(keep_slices(p, heads, p.shape.index(len(heads))),
                                                  requires_grad=p.requires_grad)
        for child, layer in m.named_modules(prefix=name):  # a linear layer giving a value per head
            if isinstance(layer, nn.Linear) and layer.out_features == len(heads) and child not in masks \
                    and child in graph.headless:  # (Swin-v2's position bias MLP)
                RULES["linear"].cut(layer, {"out": heads})
    shared = {id(t) for t in (*model.parameters(), *model.buffers())}
    for m in new.modules():  # everything not cut: its own copy, not the original's tensor
        for key, p in list(m._parameters.items()):
            if p is not None and id(p) in shared:
                m._parameters[key] = nn.Parameter(p.detach().clone(), requires_grad=p.requires_grad)
        for key, b in list(m._buffers.items()):
            if b is not None and id(b) in shared:
                m._buffers[key] = b.clone()
    return new


def head_masks(graph: ChannelGraph, masks: dict[str, dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """{attention module: keep-mask of its heads} for every attention whose heads the cut
    removes (read off its head gate's mask in ``masks``)."""
    gates = {graph.find(use.map.segs[0].space): use.module for use in graph.uses if use.kind == "head_gate"}
    found = {}
    for name, (space, _) in graph.head_modules.items():
        gate = gates.get(graph.find(space))
        keep = masks.get(gate, {}).get("channels") if gate else None
        if keep is not None and not bool(keep.all()):
            found[name] = keep
    return found


def kind_of(use: Use) -> str:
    """The layer kind of a use (``conv_in`` -> ``conv``)."""
    return use.kind[:-3] if use.kind.endswith("_in") else use.kind[:-4] if use.kind.endswith("_out") \
        else use.kind


# integer attributes that never hold a width, whatever value they have
# (a number of heads is set where the cut removes heads whole: ``graph.head_modules``)
NOT_WIDTHS = {*HEAD_ATTRS, "kernel_size", "stride", "padding", "dilation", "groups", "depth", "num_layers",
              "n", "k", "s", "p", "d", "g", "e", "training", "num_classes", "img_size",
              "image_size", "input_size", "patch_size", "window_size", "resolution", "size", "seed",
              "index", "idx", "i", "layer_idx", "block_idx", "stage", "scale_factor", "reduction"}
_LAYERS = (nn.modules.conv._ConvNd, nn.Linear, nn.modules.batchnorm._BatchNorm)  # ``cut`` sets theirs


def _side(attr: str) -> str | None:
    """Which side of a module an attribute's name says it measures: ``out_channels``, ``oup``,
    ``out_chs`` its output, ``in_channels``, ``inp`` its input; None when it does not say."""
    words = attr.lower().split("_")
    if words[0] in ("out", "oup", "output") or attr in ("c2", "cout"):
        return "out"
    if words[0] in ("in", "inp", "input") or attr in ("c1", "cin"):
        return "in"
    return None


class WidthChange(NamedTuple):
    """An integer attribute ``update_widths`` set: ``module``'s ``attr`` from ``old`` to ``new``;
    ``sure`` where it must follow the channels (the check need not vouch for it)."""

    module: str
    attr: str
    old: int
    new: int
    sure: bool


def update_widths(new: nn.Module, graph: ChannelGraph, group_masks: dict[int, torch.Tensor],
                  skip: set[str] = frozenset()) -> list[WidthChange]:
    """Integer attributes of ``new``'s modules that held a width the cut changed (a C2f block's
    ``self.c``, timm's ``num_features``), set to the new width where the trace can tell: the
    attribute's value is the width of tensors the module made or split in its own forward (else
    of its inputs and outputs, else of its children's), and all of those were cut alike. Those
    it cannot tell are named in one warning. Returns what it set, as ``WidthChange`` records:
    ``sure`` where the value is the ``groups`` of a depthwise
    convolution the module's forward called on those channels (a blur filter's), or a size its
    forward split or reshaped its channels by (an attention's ``key_dim``, ``head_dim``): those
    must follow them; the others ``prune``'s check vouches for. ``skip``: the modules in
    ``ignore`` (and inside them), which keep their own widths, integers too."""
    changed, unclear, counts = [], [], {}
    for name, (space, attr) in graph.head_modules.items():  # attention heads cut whole: their number
        if name in skip:
            continue
        heads, module = group_masks.get(graph.find(space)), new.get_submodule(name)
        if heads is not None and not bool(heads.all()) and getattr(module, attr, None) == len(heads):
            _change(module, WidthChange(name, attr, len(heads), int(heads.sum()), True), changed)
    for name, module in new.named_modules():
        if name not in skip and not (type(module).__module__.startswith("torch.") or is_layer(module)):
            _module_widths(name, module, graph, group_masks, changed, unclear, counts)
    if unclear:
        warnings.warn(f"{len(unclear)} integer attribute(s) held a width the cut changed and were left "
                      f"as they were (the trace cannot tell which width they mean): {', '.join(unclear[:6])}",
                      stacklevel=3)
    return changed


def _change(module: nn.Module, change: WidthChange, changed: list[WidthChange]) -> None:
    setattr(module, change.attr, change.new)
    changed.append(change)


def _module_widths(name: str, module: nn.Module, graph: ChannelGraph, group_masks: dict[int, torch.Tensor],
                   changed: list[WidthChange], unclear: list[str], counts: dict) -> None:
    """``update_widths`` for one module (torch's own modules keep no widths but the layers',
    set by ``cut``): what each integer attribute becomes, added to ``changed``, or its name to
    ``unclear``. ``counts``: id of a map -> (the map, its kept count), shared by the modules."""

    ints = {a: v for a, v in vars(module).items()
            if not a.startswith("_") and a not in NOT_WIDTHS and type(v) is int}
    if not ints:
        return

    def widths_of(maps: list[Map]) -> dict[int, set[int]]:
        widths: dict[int, set[int]] = {}
        for m in maps:
            if m.factor == 1:
                if id(m) not in counts:  # the same map is many modules' input or output
                    counts[id(m)] = (m, int(graph.mask_of(m, group_masks).sum()))
                widths.setdefault(m.channels, set()).add(counts[id(m)][1])
        return widths

    prefix = f"{name}." if name else ""
    children = [m for child, _ in module.named_children() for m in graph.borders.get(prefix + child, [])]
    # the heads its forward merged (``reshape(B, N, self.attn_dim)``), then what its forward
    # made, then its inputs and outputs, then its children's
    sources = [widths_of(graph.merges.get(name, [])), widths_of(graph.frames.get(name, [])),
               widths_of(graph.borders.get(name, [])), widths_of(children)]
    groups = widths_of([m for count, m in graph.group_counts.get(name, [])])
    for attr, value in ints.items():
        if value in groups and len(groups[value]) == 1:  # the groups= it convolved with
            if groups[value] != {value}:
                _change(module, WidthChange(name, attr, value, next(iter(groups[value])), True), changed)
            continue
        side = _side(attr)  # out_channels: the width of what it gives, in_chs: of what it reads
        if side is not None:
            found = widths_of(graph.sides.get((name, side), [])).get(value)
        else:
            found = next((w[value] for w in sources if value in w), None)
        if found is None or found == {value}:
            continue
        if len(found) == 1:
            sure = (name, value) in graph.split_sizes
            _change(module, WidthChange(name, attr, value, next(iter(found)), sure), changed)
        else:
            unclear.append(prefix + attr)
