"""How to cut a traced network, once the keep-masks of its channel groups are known.

``plan`` turns group masks into per-module masks through the channel graph: what a layer
reads (``in``), makes (``out``) or carries (``channels``: a BatchNorm, a depthwise convolution,
a layer scale); a linear layer after a flatten keeps ``factor`` columns per channel. ``cut``
applies the plan to a copy of the model, each layer by the rule of its kind
(``slimming.layers.rules``: which tensor follows which channels along which dim), and
``update_widths`` sets the integer attributes that held a width the cut changed.
(``slimming.layers.resize.resize_like`` is the way back: a freshly built network given a
pruned state_dict's widths.)

A registered family is cut by the surgery its class declares (``SURGERY``), on a network
rebuilt as ``Net(cfg)``: ``"chain"`` (NIN, VGG) walks the old and new ``modules()`` side by
side with a ``start_mask`` (input channels) and an ``end_mask`` (output channels), as the
paper's code does (``copy_chain_weights``); ``"sliced"`` (the pre-activation ResNet and
DenseNet, whose layers read shared tensors) cuts per BN exactly the weights the family lists
(``channel_slices()``, ``copy_sliced_weights``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import nn

from ..layers.baked import bake
from ..layers.gates import ATTR as GATE
from ..layers.rules import RULES, ChannelGate, is_layer
from ..models.common import BN_STATE
from ..utils.modules import keep_slices
from .graph import ChannelGraph, GraphError, Map, ScaleSlot, structure_copy
from .ops import HEAD_ATTRS
from .records import ModuleMasks
from .traced import Traced


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


def cut(model: nn.Module, masks: dict[str, dict[str, torch.Tensor]], traced: Traced) -> nn.Module:
    """A copy of ``model`` with every module in ``masks`` cut to its kept channels by the rule
    of its kind (``slimming.layers.rules.RULES``): the very tensors the trace saw it use (a
    buffer used as a convolution's weight too), and its width attributes. The original is left
    untouched (no tensor is shared between the two). A layer whose forward computes its weight
    (``Baked.computed``) is baked into the plain layer it ran first (``slimming.layers.baked``)."""
    graph = traced.graph
    new = structure_copy(model)
    how = {use.module: use for use in graph.uses if use.kind != "scale"}
    for name, weight in traced.baked.computed.items():  # a weight its forward computes (standardised):
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
            RULES[use.kind].cut(m, keep, use.attrs, use.groups)
    for name, heads in head_masks(graph, masks).items():  # per-head tensors of an attention cut by heads
        m = new.get_submodule(name)
        # its own (a relative position bias table), or a table of a helper inside it that no
        # rule cuts (Hugging Face Swin's ``relative_position_bias`` module; never a 1-D weight,
        # which a norm of its own over each head's channels may have)
        holders = [m, *(h for child, h in m.named_modules(prefix=name) if child != name and child not in masks
                        and child not in graph.head_modules and not is_layer(h) and h._parameters)]
        for holder in holders:
            for key, p in list(holder._parameters.items()):
                if p is not None and p.is_floating_point() and p.shape.count(len(heads)) == 1 \
                        and (holder is m or p.dim() > 1):
                    holder._parameters[key] = nn.Parameter(keep_slices(p, heads, p.shape.index(len(heads))),
                                                           requires_grad=p.requires_grad)
        for child, layer in m.named_modules(prefix=name):  # a linear layer giving a value per head
            if isinstance(layer, nn.Linear) and layer.out_features == len(heads) and child not in masks \
                    and child in traced.widths.headless:  # (Swin-v2's position bias MLP)
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


def update_widths(new: nn.Module, traced: Traced, group_masks: dict[int, torch.Tensor],
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
    graph = traced.graph
    for name, (space, attr) in graph.head_modules.items():  # attention heads cut whole: their number
        if name in skip:
            continue
        heads, module = group_masks.get(graph.find(space)), new.get_submodule(name)
        if heads is not None and not bool(heads.all()) and getattr(module, attr, None) == len(heads):
            _change(module, WidthChange(name, attr, len(heads), int(heads.sum()), True), changed)
    for name, module in new.named_modules():
        if name not in skip and not (type(module).__module__.startswith("torch.") or is_layer(module)):
            _module_widths(name, module, traced, group_masks, changed, unclear, counts)
    if unclear:
        warnings.warn(f"{len(unclear)} integer attribute(s) held a width the cut changed and were left "
                      f"as they were (the trace cannot tell which width they mean): {', '.join(unclear[:6])}",
                      stacklevel=3)
    return changed


def _change(module: nn.Module, change: WidthChange, changed: list[WidthChange]) -> None:
    setattr(module, change.attr, change.new)
    changed.append(change)


def _module_widths(name: str, module: nn.Module, traced: Traced, group_masks: dict[int, torch.Tensor],
                   changed: list[WidthChange], unclear: list[str], counts: dict) -> None:
    """``update_widths`` for one module (torch's own modules keep no widths but the layers',
    set by ``cut``): what each integer attribute becomes, added to ``changed``, or its name to
    ``unclear``. ``counts``: id of a map -> (the map, its kept count), shared by the modules."""

    ints = {a: v for a, v in vars(module).items()
            if not a.startswith("_") and a not in NOT_WIDTHS and type(v) is int}
    if not ints:
        return
    graph, found_widths = traced.graph, traced.widths

    def widths_of(maps: list[Map]) -> dict[int, set[int]]:
        widths: dict[int, set[int]] = {}
        for m in maps:
            if m.factor == 1:
                if id(m) not in counts:  # the same map is many modules' input or output
                    counts[id(m)] = (m, int(graph.mask_of(m, group_masks).sum()))
                widths.setdefault(m.channels, set()).add(counts[id(m)][1])
        return widths

    prefix = f"{name}." if name else ""
    children = [m for child, _ in module.named_children()
                for m in found_widths.borders.get(prefix + child, [])]
    # the heads its forward merged (``reshape(B, N, self.attn_dim)``), then what its forward
    # made, then its inputs and outputs, then its children's
    sources = [widths_of(found_widths.merges.get(name, [])), widths_of(found_widths.frames.get(name, [])),
               widths_of(found_widths.borders.get(name, [])), widths_of(children)]
    groups = widths_of([m for count, m in found_widths.group_counts.get(name, [])])
    for attr, value in ints.items():
        if value in groups and len(groups[value]) == 1:  # the groups= it convolved with
            if groups[value] != {value}:
                _change(module, WidthChange(name, attr, value, next(iter(groups[value])), True), changed)
            continue
        side = _side(attr)  # out_channels: the width of what it gives, in_chs: of what it reads
        if (name, attr) in found_widths.held:  # the forward sized a view by it: that view's width
            found = widths_of(found_widths.held[(name, attr)]).get(value)
        elif side is not None:
            found = widths_of(found_widths.sides.get((name, side), [])).get(value)
        else:
            found = next((w[value] for w in sources if value in w), None)
        if found is None or found == {value}:
            continue
        if len(found) == 1:
            sure = (name, value) in found_widths.split_sizes
            _change(module, WidthChange(name, attr, value, next(iter(found)), sure), changed)
        else:
            unclear.append(prefix + attr)


# A registered family's own surgery: its network rebuilt as Net(cfg), filled by a walk

def _take(t: torch.Tensor, dim: int, mask: torch.Tensor | None) -> torch.Tensor:
    """A copy of ``t``, cut to ``mask`` along ``dim`` when there is one."""
    return t.detach().clone() if mask is None else keep_slices(t, mask, dim)


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


# How a family is cut once the masks are known, by the ``surgery`` its Net class declares
# (slimming.models.registry).
SURGERY: dict[str, Callable[[nn.Module, nn.Module, list[torch.Tensor]], ModuleMasks]] = {
    "chain": copy_chain_weights,
    "sliced": copy_sliced_weights,
}
