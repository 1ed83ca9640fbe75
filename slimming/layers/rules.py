"""Layer kinds: one rule each, in one table (``RULES``), open to layers of your own
(``register_layer``).

A rule says which of a layer's tensors follow which channels, and everything else is derived
from that: how the trace (``slimming.pruning.trace``) ties the layer into the channel graph,
how ``slimming.pruning.surgery`` cuts it, how ``resize`` gives a freshly built one the widths of
a pruned state_dict, and whether its scale factors score channels. The tensors are named by
their part (``weight``, ``bias``, ...); a functional call with other tensors (a blur filter's
buffer ``filt`` passed to ``F.conv2d`` as its weight) names them in ``attrs``.

- ``reads``: {tensor: dim} indexed by the channels the layer reads (its first input);
- ``makes``: {tensor: dim} indexed by the channels it makes (a new set of channels);
- ``carries``: {tensor: dim} for a layer whose output channels are its input's (a BatchNorm, a
  depthwise convolution, a layer scale): cut with them;
- ``widths``: {integer attribute: "in" / "out" / "channels"}, set to the kept counts;
- ``gated``: a carried channel whose input is zero gives zero (a BatchNorm, once its gamma and
  beta are zeroed); ``scores``: its ``weight`` is the |gamma| network slimming ranks;
- ``grouped``: its weight is (out, in / groups, ...) and each group keeps equal counts;
- ``normalises``: it normalises over the channels it carries, which lie last (a LayerNorm, an
  RMSNorm): cut, it normalises over the kept ones, its ``normalized_shape`` set to their count,
  and what the cut promises is the original with those statistics taken over the kept channels
  (``slimming.pruning.norms``). Without a weight of its own it is not followed (kept);
- how the trace knows it: ``modules``, the module types it matches (subclasses too; a string
  matches a class name); ``calls``, the torch functions it is called through with one module's
  tensors (``conv2d``, ``batch_norm``, ``layer_norm``), taking them at ``positions``
  ({role, argument index}); ``last``: it reads its channels along the last dim (a linear
  layer, a LayerNorm over tokens); ``shifts``: without its weight a zero channel does not stay
  zero (a BatchNorm's running mean). A rule without ``calls`` is followed whole, as a module:
  it reads the first input's channels and makes (or carries) the output's; the other inputs
  are kept.

Every kind, built in or registered (``register_layer(ModuleType, rule)``), is a rule object in
the one table (``RULES``); a layer scale is known by a per-channel parameter in a product or
sum (``scale``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ..errors import CheckpointError, SlimmingError, clip
from ..utils.modules import keep_along, keep_slices, set_tensor

BN_TENSORS = {"weight": 0, "bias": 0, "running_mean": 0, "running_var": 0}


@dataclass(frozen=True)
class LayerRule:
    """Which tensors of a layer follow which channels (see the module's docstring)."""

    reads: dict[str, int] = field(default_factory=dict)
    makes: dict[str, int] = field(default_factory=dict)
    carries: dict[str, int] = field(default_factory=dict)
    widths: dict[str, str] = field(default_factory=dict)
    gated: bool = False
    scores: bool = False
    grouped: bool = False
    normalises: bool = False
    modules: tuple[type | str, ...] = ()
    calls: tuple[str, ...] = ()
    positions: tuple[tuple[str, int], ...] = ()
    last: bool = False
    shifts: bool = False

    def cut(self, module: nn.Module, keep: dict[str, torch.Tensor], attrs: dict[str, str] | None = None,
            groups: int = 1) -> None:
        """Cut ``module``'s tensors, in place, to the kept channels: ``keep`` holds bool masks
        ``in`` (read), ``out`` (made), ``channels`` (carried); a missing mask keeps all."""
        attrs = attrs or {}
        if self.grouped and groups > 1:
            w = attrs.get("weight", "weight")
            _set(module, w, _grouped(getattr(module, w), groups, keep.get("in"), keep.get("out")))
            rest = {role: dim for role, dim in self.makes.items() if role != "weight"}
            self._cut(module, rest, keep.get("out"), attrs)
        else:
            cuts: dict[str, list[tuple[int, torch.Tensor]]] = {}  # attribute -> its (dim, mask)s
            for tensors, side in ((self.reads, "in"), (self.makes, "out"), (self.carries, "channels")):
                if keep.get(side) is not None:
                    for role, dim in tensors.items():
                        cuts.setdefault(attrs.get(role, role), []).append((dim, keep[side]))
            for attr, dims in cuts.items():
                t = getattr(module, attr, None)
                if isinstance(t, torch.Tensor):
                    _set(module, attr, keep_along(t, dims))
        for attr, side in self.widths.items():
            mask = keep.get(side)
            value = getattr(module, attr, None)
            if mask is not None and isinstance(value, int) and not isinstance(value, bool):
                setattr(module, attr, int(mask.sum()))
        if self.normalises and keep.get("channels") is not None:
            _normalized_shape(module, int(keep["channels"].sum()))

    @staticmethod
    def _cut(module: nn.Module, tensors: dict[str, int], mask: torch.Tensor | None, attrs) -> None:
        if mask is None:
            return
        for role, dim in tensors.items():
            t = getattr(module, attrs.get(role, role), None)
            if isinstance(t, torch.Tensor):
                _set(module, attrs.get(role, role), keep_slices(t, mask, dim))

    def resize(self, module: nn.Module, state_dict: dict, prefix: str, path: str) -> bool:
        """Give ``module`` (freshly built, on the meta device) the shapes its tensors have in
        ``state_dict`` where only the dims this rule cuts differ, and its width attributes the
        counts those say; False when nothing changed. CheckpointError for other shapes."""
        sizes: dict[str, int] = {}
        changed = False
        for tensors, side in ((self.reads, "in"), (self.makes, "out"), (self.carries, "channels")):
            for role, dim in tensors.items():
                old, new = getattr(module, role, None), state_dict.get(prefix + role)
                if not isinstance(old, torch.Tensor) or not isinstance(new, torch.Tensor):
                    continue
                if new.dim() != old.dim() or any(a != b for i, (a, b) in enumerate(zip(new.shape, old.shape))
                                                 if i not in self._dims(role)):
                    raise CheckpointError(f"{path}: {prefix}{role} has shape {tuple(new.shape)}, which "
                                          f"no cut of a {tuple(old.shape)} {type(module).__name__} gives")
                scale = getattr(module, "groups", 1) if self.grouped and side == "in" else 1
                sizes.setdefault(side, new.shape[dim] * scale)
                if new.shape != old.shape:
                    set_tensor(module, role, torch.empty(new.shape, dtype=old.dtype, device=old.device),
                               role in module._parameters)
                    changed = True
        for attr, side in self.widths.items():
            if side in sizes and isinstance(getattr(module, attr, None), int):
                setattr(module, attr, sizes[side])
        if self.normalises and "channels" in sizes:
            _normalized_shape(module, sizes["channels"])
        return changed

    def _dims(self, role: str) -> set[int]:
        return {d for tensors in (self.reads, self.makes, self.carries)
                for r, d in tensors.items() if r == role}


@dataclass(frozen=True)
class ConvRule(LayerRule):
    """A convolution: plain, grouped (equal counts per group) or depthwise (``groups`` equal to
    its channels, which a cut changes: resized as the ``depthwise`` kind)."""

    def resize(self, module: nn.Module, state_dict: dict, prefix: str, path: str) -> bool:
        w = state_dict.get(prefix + "weight")
        groups = getattr(module, "groups", 1)
        if isinstance(w, torch.Tensor) and w.shape != module.weight.shape and groups > 1:
            if groups == module.in_channels == module.out_channels:
                if w.dim() != module.weight.dim() or w.shape[1] != 1:
                    raise CheckpointError(f"{path}: {prefix}weight is not a depthwise kernel")
                return RULES["depthwise"].resize(module, state_dict, prefix, path)
            if w.shape[0] % groups:
                raise CheckpointError(f"{path}: {prefix}weight: {w.shape[0]} output channels do not "
                                      f"make {groups} equal groups")
        return super().resize(module, state_dict, prefix, path)


@dataclass(frozen=True)
class ScaleRule(LayerRule):
    """A per-channel parameter or buffer (a layer scale ``gamma``), applied by a product or a
    sum; the dim its channels lie along is the trace's (``groups`` in ``cut``)."""

    def cut(self, module, keep, attrs=None, groups: int = 0) -> None:
        attr = (attrs or {}).get("weight", "weight")
        _set(module, attr, keep_slices(getattr(module, attr), keep["channels"], groups))


@dataclass(frozen=True)
class GroupNormRule(LayerRule):
    """A GroupNorm: cut by whole groups (the graph keeps a group's channels together), so its
    ``num_groups`` falls with them and each group keeps its size."""

    def cut(self, module, keep, attrs=None, groups: int = 1) -> None:
        size = module.num_channels // module.num_groups
        super().cut(module, keep, attrs, groups)
        if keep.get("channels") is not None:
            module.num_groups = module.num_channels // size

    def resize(self, module, state_dict, prefix, path) -> bool:
        size = module.num_channels // module.num_groups
        changed = super().resize(module, state_dict, prefix, path)
        if module.num_channels % size:
            raise CheckpointError(f"{path}: {prefix}weight has {module.num_channels} channels, not whole "
                                  f"groups of {size}")
        module.num_groups = module.num_channels // size
        return changed


class ChannelGate(nn.Module):
    """A per-channel scaling factor where a network has none (``slimming.add_gates``): its
    input times ``weight`` (ones at the start) along ``dim``, the channels' dimension (1 for
    (N, C, ...), -1 for channels-last tokens). Trained sparse and scored as a BatchNorm's gamma;
    folded into the layer it feeds at the cut (``slimming.layers.gates``)."""

    def __init__(self, channels: int, dim: int = 1):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = [1] * x.dim()
        shape[self.dim] = -1
        return x * self.weight.view(shape)

    def extra_repr(self) -> str:
        return f"{self.weight.numel()}, dim={self.dim}"


class HeadGate(ChannelGate):
    """A gate per attention head (``slimming.add_gates``): its input's channels along ``dim``
    are the heads' outputs merged before the output projection, ``heads`` equal runs, each
    scaled by its head's ``weight``. A zero gate silences the whole head, so the cut removes it
    (its queries, keys and values) and ``num_heads`` falls with it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = self.dim % x.dim()
        shape = [1] * (x.dim() + 1)
        shape[d] = -1
        return (x.unflatten(d, (self.weight.numel(), -1)) * self.weight.view(shape)).flatten(d, d + 1)

    def extra_repr(self) -> str:
        return f"{self.weight.numel()} heads, dim={self.dim}"


_CONV = (("weight", 1), ("bias", 2))  # where F.convNd / F.linear take a layer's tensors
_NORM = (("running_mean", 1), ("running_var", 2), ("weight", 3), ("bias", 4))  # F.batch_norm's
_AFFINE = (("weight", 2), ("bias", 3))  # F.group_norm's, F.layer_norm's
RULES: dict[str, LayerRule] = {
    "convt": LayerRule(reads={"weight": 0}, makes={"weight": 1, "bias": 0},
                       widths={"in_channels": "in", "out_channels": "out"},
                       modules=(nn.modules.conv._ConvTransposeNd,),
                       calls=("conv_transpose1d", "conv_transpose2d", "conv_transpose3d"), positions=_CONV),
    "conv": ConvRule(reads={"weight": 1}, makes={"weight": 0, "bias": 0}, grouped=True,
                     widths={"in_channels": "in", "out_channels": "out"}, modules=(nn.modules.conv._ConvNd,),
                     calls=("conv1d", "conv2d", "conv3d"), positions=_CONV),
    "linear": LayerRule(reads={"weight": 1}, makes={"weight": 0, "bias": 0},
                        widths={"in_features": "in", "out_features": "out"}, modules=(nn.Linear,),
                        calls=("linear",), positions=_CONV, last=True),
    # a convolution of groups == channels, known at its call: cut with the channels it carries
    "depthwise": LayerRule(carries={"weight": 0, "bias": 0},
                           widths={"in_channels": "channels", "out_channels": "channels",
                                   "groups": "channels"}),
    "bn": LayerRule(carries=BN_TENSORS, widths={"num_features": "channels"}, gated=True, scores=True,
                    modules=(nn.modules.batchnorm._BatchNorm,), calls=("batch_norm",), positions=_NORM,
                    shifts=True),
    # torchvision's FrozenBatchNorm2d (a pretrained detector's backbone), followed whole: its
    # gamma, a buffer, scores its channels as a BatchNorm's does (``unfreeze_batchnorms`` makes
    # it trainable for sparsity training)
    "frozen_bn": LayerRule(carries=BN_TENSORS, gated=True, scores=True, modules=("FrozenBatchNorm2d",)),
    # an affine InstanceNorm's gamma is a scaling factor as a BatchNorm's: it normalises each
    # channel alone, so a cut leaves the others as they were (without affine: carried, unscored)
    "instance_norm": LayerRule(carries=BN_TENSORS, widths={"num_features": "channels"}, gated=True,
                               scores=True, modules=(nn.modules.instancenorm._InstanceNorm,),
                               calls=("instance_norm",), positions=_NORM, shifts=True),
    "group_norm": GroupNormRule(carries={"weight": 0, "bias": 0}, widths={"num_channels": "channels"},
                                gated=True, scores=True, modules=(nn.GroupNorm,), calls=("group_norm",),
                                positions=_AFFINE),
    # a LayerNorm is known by the layer_norm it calls (timm's LayerNorm2d permutes around it);
    # an RMSNorm is followed whole: both are this one rule
    "layer_norm": LayerRule(carries={"weight": 0, "bias": 0}, gated=True, scores=True, normalises=True,
                            modules=(nn.LayerNorm,), calls=("layer_norm",), positions=_AFFINE, last=True),
    "rms_norm": LayerRule(carries={"weight": 0}, gated=True, scores=True, normalises=True,
                          modules=(nn.RMSNorm,)),
    "scale": ScaleRule(),
    "gate": LayerRule(carries={"weight": 0}, gated=True, scores=True, modules=(ChannelGate,)),
    # one weight per head: the trace gives it the heads' own space (``slimming.pruning.trace``)
    "head_gate": LayerRule(carries={"weight": 0}, scores=True, modules=(HeadGate,)),
}
# type (or class name) -> kind: every rule's ``modules``, and the types registered
MODULE_RULES: dict[type | str, str] = {t: kind for kind, rule in RULES.items() for t in rule.modules}


def is_factor_layer(module: nn.Module) -> bool:
    """Whether ``module``'s per-channel ``weight`` is a slimming factor (the paper's scaling
    factors, ranked and trained sparse): a layer whose rule ``scores`` (a BatchNorm, frozen or
    not, a GroupNorm scored by whole groups, a LayerNorm or RMSNorm over one dim, a gate, a
    registered kind)."""
    kind = layer_kind(module)
    if kind is None or not RULES[kind].scores:
        return False
    weight, shape = getattr(module, "weight", None), getattr(module, "normalized_shape", None)
    if RULES[kind].calls:  # a built-in kind, known by type (a weightless one is no factor: skipped)
        return not RULES[kind].normalises or len(shape) == 1
    return isinstance(weight, torch.Tensor) and (not RULES[kind].normalises or weight.dim() == 1)


def factor_width(module: nn.Module) -> int:
    """The number of channels a factor layer scales (``num_features``, ``num_channels``,
    ``normalized_shape``, or its weight's length)."""
    for attr in ("num_features", "num_channels"):
        value = getattr(module, attr, None)
        if isinstance(value, int):
            return value
    shape = getattr(module, "normalized_shape", None)
    return shape[0] if shape else module.weight.numel()


_MISSING = object()
# (id of a table, key) -> [the value before the first registration still held (or _MISSING),
# then (registration, value) for each registration of that key still held, oldest first]
_HELD: dict[tuple[int, object], list] = {}


class Registration(str):
    """What ``register_layer`` and ``register_op`` return: the name registered (a ``str``), and
    the way back, as torch's hook handles give it. Made with the table entries it sets,
    (table, key, value); ``remove()`` takes back its own and nothing else: where a later
    registration of the same key is still held, that one's value stays; where none is, the value
    from before them all comes back (a built-in rule it replaced). A ``with`` block removes it when
    the block ends. Removing twice does nothing."""

    def __new__(cls, name: str, entries: list[tuple[dict, object, object]]):
        self = super().__new__(cls, name)
        self._keys, self._removed = [(table, key) for table, key, _ in entries], False
        for table, key, value in entries:
            _HELD.setdefault((id(table), key), [table.get(key, _MISSING)]).append((self, value))
            table[key] = value
        return self

    def remove(self) -> None:
        if self._removed:
            return
        self._removed = True
        for table, key in self._keys:
            held = _HELD[(id(table), key)]
            held[1:] = [(r, v) for r, v in held[1:] if r is not self]
            value = held[-1][1] if len(held) > 1 else held[0]
            if len(held) == 1:
                del _HELD[(id(table), key)]
            if value is _MISSING:
                table.pop(key, None)
            else:
                table[key] = value

    def __enter__(self) -> Registration:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


def register_layer(module_type: type, rule: LayerRule, name: str | None = None) -> Registration:
    """Follow modules of ``module_type`` (and its subclasses) whole, as one layer cut by
    ``rule``: the trace does not look inside them. Returns the kind's name (default: the class
    name), under which the rule is in ``RULES``, as a ``Registration``: ``.remove()`` undoes the
    registration, and ``with slimming.register_layer(T, rule):`` keeps it to the block (prune,
    save and load a pruned network inside it; the rule is process-wide while it holds).
    Registering the same class again replaces its rule (a notebook cell run twice)."""
    if not (isinstance(module_type, type) and issubclass(module_type, nn.Module)):
        raise SlimmingError(f"register_layer takes an nn.Module subclass, not {module_type!r}",
                            param="module_type")
    if not isinstance(rule, LayerRule) or not (rule.makes or rule.carries):
        raise SlimmingError("a layer rule makes channels (makes=) or carries them (carries=)", param="rule")
    for field_, tensors in (("reads", rule.reads), ("makes", rule.makes), ("carries", rule.carries)):
        bad = [(k, d) for k, d in (tensors.items() if isinstance(tensors, dict) else [(tensors, None)])
               if not isinstance(k, str) or type(d) is not int or not 0 <= d <= 5]
        if bad:
            raise SlimmingError(f"a layer rule's {field_}= maps tensor names to the dim of their channels "
                                f"(0 to 5), not {clip(repr(bad[0]))}", param="rule")
    if name is not None and not (isinstance(name, str) and name.strip()):
        raise SlimmingError(f"register_layer's name is the layer kind's name (a non-empty string), not "
                            f"{clip(repr(name))}", param="name")
    name = name or module_type.__name__
    taken = [t for t, k in MODULE_RULES.items() if k == name and t is not module_type
             and getattr(t, "__qualname__", t) != module_type.__qualname__]
    if (name in RULES and name not in MODULE_RULES.values()) or taken:
        raise SlimmingError(f"the layer kind {name!r} is taken; pass name=", param="name")
    return Registration(name, [(RULES, name, rule), (MODULE_RULES, module_type, name)])


def layer_kind(module: nn.Module) -> str | None:
    """The kind of layer ``module`` is, by its type (the first of its classes, most derived
    first, that a rule's ``modules`` or a registration names), or None."""
    for cls in type(module).__mro__:
        if cls in MODULE_RULES:
            return MODULE_RULES[cls]
    return MODULE_RULES.get(type(module).__name__)


def module_kind(module: nn.Module) -> str | None:
    """The kind a module is followed whole as: a layer whose rule has no ``calls`` to know it
    by (a registered type, a frozen BatchNorm, an RMSNorm, a gate)."""
    kind = layer_kind(module)
    return kind if kind is not None and not RULES[kind].calls else None


def is_layer(module: nn.Module) -> bool:
    """Whether ``module`` is a layer some rule cuts (the trace names those it never reached)."""
    return layer_kind(module) is not None


def resize_layer(module: nn.Module, state_dict: dict, prefix: str, path: str) -> None:
    """``module`` given the widths its tensors have in ``state_dict``, by the rule of its kind."""
    kind = layer_kind(module)
    if kind is not None:
        if kind == "convt" and getattr(module, "groups", 1) != 1:
            w = state_dict.get(prefix + "weight")
            if isinstance(w, torch.Tensor) and w.shape != module.weight.shape:
                raise CheckpointError(f"{path}: {prefix}weight has shape {tuple(w.shape)}, not that "
                                      "of a cut transposed convolution")
        RULES[kind].resize(module, state_dict, prefix, path)


def _normalized_shape(module: nn.Module, width: int) -> None:
    """A normalisation's ``normalized_shape`` (a LayerNorm's, an RMSNorm's) set to ``width``
    channels, where it has one of one dim."""
    shape = getattr(module, "normalized_shape", None)
    if isinstance(shape, (tuple, list)) and len(shape) == 1:
        module.normalized_shape = (width,)


def _set(m: nn.Module, attr: str, value: torch.Tensor) -> None:
    set_tensor(m, attr, value, attr in m._parameters)


def _grouped(w: torch.Tensor, g: int, keep_in: torch.Tensor | None,
             keep_out: torch.Tensor | None) -> torch.Tensor:
    """A grouped convolution's weight (out, in/groups, k...) cut to the kept channels: every
    group keeps the same number of inputs and of outputs (the graph's equal-count blocks)."""
    w = w.detach()
    keep_in = torch.ones(w.shape[1] * g, dtype=torch.bool) if keep_in is None else keep_in.cpu()
    keep_out = torch.ones(w.shape[0], dtype=torch.bool) if keep_out is None else keep_out.cpu()
    ins, outs = keep_in.view(g, -1), keep_out.view(g, -1)
    if len(set(ins.sum(1).tolist())) > 1 or len(set(outs.sum(1).tolist())) > 1:
        raise SlimmingError(f"a grouped convolution of {g} groups would keep unequal groups")
    blocks = w.view(g, -1, *w.shape[1:])
    parts = [blocks[j][outs[j].to(w.device)][:, ins[j].to(w.device)] for j in range(g)]
    return torch.cat(parts).clone()


def unfreeze_batchnorms(model: nn.Module) -> list[str]:
    """Replace, in place, every frozen BatchNorm of ``model`` (torchvision's
    ``FrozenBatchNorm2d``, what its detection models build on a pretrained backbone) by an
    ``nn.BatchNorm2d`` that computes the same in eval mode: its gamma and beta become parameters
    that sparsity training can move (``slimming.Sparsity``), its statistics are kept. Returns
    the names replaced. The new BatchNorms take the mode of the module they sit in; with small
    detection batches, keep them in eval mode while training (``m.eval()`` for each) so that only
    gamma and beta learn."""
    names = []
    for name, m in list(model.named_modules()):
        if layer_kind(m) != "frozen_bn":
            continue
        w = m.weight
        bn = nn.BatchNorm2d(w.numel(), eps=getattr(m, "eps", 1e-5), device=w.device, dtype=w.dtype)
        with torch.no_grad():
            for attr in ("weight", "bias", "running_mean", "running_var"):
                getattr(bn, attr).copy_(getattr(m, attr))
        bn.train(m.training)
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, bn)
        names.append(name)
    return names
