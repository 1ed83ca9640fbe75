"""``trace``: the channel graph of a network (``slimming.pruning.graph``), built by running one
real forward of the example input in eval mode and watching every torch function it calls.

Why a ``TorchFunctionMode`` rather than torch.fx or the autograd graph: a real forward follows
any Python the network's authors wrote (loops and lists over ``chunk``, shape checks, layers
picked by index, dict and nested outputs), which torch.fx refuses; every torch function and
tensor method is seen with its real arguments (``dim``, slice bounds, split sizes), which the
autograd graph does not keep, and no graph of gradients is built. Convolutions (1-D, 2-D, 3-D,
transposed), BatchNorms and linear layers are recognised by their tensors (a module's weight,
or a buffer, passed to ``F.conv2d`` is that module's layer, called as a module or not); forward
hooks keep the stack of modules for messages and ``ignore``, and bracket the modules followed
whole (``FrozenBatchNorm2d``). A module called twice (a head shared across levels) makes the
same channels both times, and its two inputs are cut alike.

The trace follows the path the example input takes. Layers it did not reach in eval mode are
looked for once more in a training-mode forward (auxiliary heads that only run in training),
with every buffer restored after; what neither reached keeps all its channels and is named in
a warning. An all-zero example (``prune``'s default) carries no values to follow, so there the
convolutions' arithmetic, most of a forward's time, is skipped: a convolution gives zeros of
the shape it would give (with a real image as the example, everything is computed).

Decided at the end, not at the op: an op whose channels cannot be followed one by one (an
attention reshape it cannot pair, an RMSNorm over the channels, an op it does not know; a
LayerNorm over them is followed, ``rule_layer_norm``) keeps every channel
it reads (pinned) and makes new channels that are kept whole; the rest of the network is still
cut, exactly. One warning lists, by module type, each such op that kept channels a BatchNorm
scores (most sit on channels nothing scores, and say nothing). An in-place write through a view
or alias of a tensor keeps the channels of every tensor sharing its memory. What each op does to
the channels is in ``slimming.pruning.ops``; the layers are here.
"""

from __future__ import annotations

import warnings
from collections import defaultdict

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from ..errors import SlimmingError, first_line
from ..models.layers import RULES, Registration, is_layer, module_kind
from ..utils.modules import modes_kept
from .graph import ChannelGraph, GraphError, Kept, Map, Seg, Use, ignored_names
from .ops import (
    CONSTANT_OPS,
    ELEMENTWISE,
    META_OPS,
    NORM_OPS,
    PASS_OPS,
    PRODUCT_OPS,
    REDUCE_OPS,
    RESHAPE_OPS,
    SPATIAL_OPS,
    SPLIT_OPS,
    SUM_OPS,
    VALUE_OPS,
    ZERO_OPS,
    ChannelOps,
    arg,
    in_place,
    keeps_zero,
    leaves,
    op_name,
    tensors,
)

BN = nn.modules.batchnorm._BatchNorm
CONVS = {"conv1d": 1, "conv2d": 2, "conv3d": 3}
TRANSPOSED = {"conv_transpose1d": 1, "conv_transpose2d": 2, "conv_transpose3d": 3}
LAYERS = {*CONVS, *TRANSPOSED, "linear", "batch_norm"}
_SHORTCUT = {torch.conv1d, torch.conv2d, torch.conv3d}
# where a layer op takes its tensors (F.batch_norm / F.instance_norm, F.convNd / F.linear)
NORM_ROLES = (("running_mean", 1), ("running_var", 2), ("weight", 3), ("bias", 4))
LAYER_ROLES = (("weight", 1), ("bias", 2))


def _conv_shape(args, kwargs) -> torch.Tensor | None:
    """Zeros of the shape ``F.convNd`` would give (None where the arguments are not the plain
    ones): what a blank example needs of a convolution, without its arithmetic."""
    if kwargs or len(args) != 7 or not isinstance(args[0], torch.Tensor) or args[0].dim() < 3:
        return None
    x, w, _, stride, padding, dilation, groups = args
    d = x.dim() - 2
    if not all(isinstance(v, (tuple, list)) and len(v) == d for v in (stride, padding, dilation)) \
            or not isinstance(w, torch.Tensor) or w.dim() != x.dim() or x.shape[1] != w.shape[1] * groups:
        return None
    size = [(n + 2 * p - dl * (k - 1) - 1) // s + 1 for n, p, dl, k, s in
            zip(x.shape[2:], padding, dilation, w.shape[2:], stride)]
    return x.new_zeros(x.shape[0], w.shape[0], *size) if min(size) > 0 else None


class _Mode(TorchFunctionMode):
    """Hands every torch call of the forward, after running it, to the walk."""

    def __init__(self, walk: _Walk):
        super().__init__()
        self.walk = walk

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = _conv_shape(args, kwargs) if self.walk.blank and func in _SHORTCUT else None
        out = func(*args, **kwargs) if out is None else out
        if not self.walk.whole:
            self.walk.step(func, args, kwargs, out)
        return out


def as_inputs(example_inputs) -> tuple:
    """The model's positional inputs: one tensor, or a tuple or list of them (and of other
    values, passed as they are)."""
    return tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)


def trace(model: nn.Module, example_inputs, ignore=(), keep_whole=(),
          follow_sizes: bool = True) -> ChannelGraph:
    """Run ``model`` (left unchanged, every module's train/eval flag restored) on
    ``example_inputs`` (a tensor (N, C, ...), or a tuple of the forward's inputs) in eval mode
    and build its channel graph. ``ignore``: modules whose own channels are kept (what they
    make, and their inner widths), while the channels they read are cut where their producers
    are; ``keep_whole``: modules kept whole, the channels they read too. Each by name (a name
    keeps what is inside it too) or by type (``ignored_names``). ``follow_sizes``: follow the
    reshapes that split channels into blocks (attention heads) and the splits by sizes a module
    keeps in integer attributes (queries, keys and values); the pruned forward then reads
    widths the cut must set (``surgery.update_widths``), which only the check can vouch for, so
    False keeps those channels. GraphError (one line) for a model that does not run on the
    example."""
    inputs = as_inputs(example_inputs)
    images = [t for t in inputs if isinstance(t, torch.Tensor)]
    if not images or any(t.dim() < 2 for t in images):
        shapes = [tuple(t.shape) for t in images]
        raise GraphError(f"the model's inputs are {shapes or 'no tensors'}: slimming needs tensors "
                         "with a channel dimension (N, C, ...)")
    keep, whole = ignored_names(model, ignore), ignored_names(model, keep_whole)
    walk = _Walk(model, keep | whole, whole, follow_sizes=follow_sizes)
    with modes_kept(model):
        walk.run(inputs, training=False)
        if walk.unseen():
            try:
                second = _Walk(model, keep | whole, whole, walk, follow_sizes)
                second.run(tuple(torch.cat([t, t]) if isinstance(t, torch.Tensor) else t
                                 for t in inputs), training=True)
                walk = second
            except GraphError:  # no training forward on this example (a detector needs targets)
                pass
    walk.finish()
    return walk.g


class _Walk(ChannelOps):
    """The channel maps of the forward's tensors, and the graph they build. ``after``: a walk
    whose eval-mode forward this one continues in training mode (the same graph)."""

    def __init__(self, model: nn.Module, ignore: set[str], whole: set[str], after: _Walk | None = None,
                 follow_sizes: bool = True):
        self.model, self.ignore, self.keep_whole = model, ignore, whole
        self.follow_sizes = follow_sizes
        self.modules = dict(model.named_modules())
        self.g = ChannelGraph(model) if after is None else after.g.copy()
        self.maps: dict[int, tuple[torch.Tensor, Map]] = {}  # id -> (tensor kept alive, map)
        self.storage: dict[int, set[int]] = defaultdict(set)  # memory -> ids of tracked tensors
        self.stack: list[str] = []
        self.whole = 0  # > 0 inside a module followed whole
        self.owner: dict[int, tuple[str, str]] = {}  # id of a parameter or buffer -> (module, attr)
        for name, m in model.named_modules():
            for attr, t in (*m._parameters.items(), *m._buffers.items()):
                if t is not None:
                    self.owner.setdefault(id(t), (name, attr))
        self.seen: set[str] = set(after.seen) if after else set()
        self.made = dict(after.made) if after else {}  # layer -> (its output space, its first input)
        self.input_maps: list[Map | None] = list(after.input_maps) if after else []
        self.blank = False  # an all-zero example: convolutions give zeros of their shape

    # ------------------------------------------------------------------ bookkeeping

    def run(self, inputs: tuple, training: bool) -> None:
        hooks, saved = [], [(b, b.clone()) for b in self.model.buffers()] if training else []
        try:
            for name, m in self.model.named_modules():
                hooks.append(m.register_forward_pre_hook(self.enter(name, m)))
                hooks.append(m.register_forward_hook(self.leave(name, m)))
            self.model.train(training)
            self.start(inputs)
            try:
                with torch.no_grad(), _Mode(self):
                    out = self.model(*inputs)
            except GraphError:
                raise
            except Exception as e:
                shapes = ", ".join(str(tuple(t.shape)) for t in inputs if isinstance(t, torch.Tensor))
                raise GraphError(f"{type(self.model).__name__} does not run"
                                 f"{' in training mode' if training else ''} on example_inputs of "
                                 f"shape {shapes}: {first_line(e, 160)}") from None
            for t in leaves(out):
                self.pin_tensor(t, "the model's output")
        finally:
            for h in hooks:
                h.remove()
            with torch.no_grad():
                for b, value in saved:
                    b.copy_(value)

    def start(self, inputs: tuple) -> None:
        images = [t for t in inputs if isinstance(t, torch.Tensor)]
        self.blank = not any(bool(t.any()) for t in images)
        for i, t in enumerate(images):
            if len(self.input_maps) <= i:
                space = self.g.new_space(t.shape[1], f"input {i} of the model" if i else "the input image")
                self.input_maps.append(Map([Seg(space, 0, t.shape[1], False)]))
            self.set(t, self.input_maps[i])

    def layer_names(self) -> list[str]:
        return [name for name, m in self.modules.items() if is_layer(m)]

    def unseen(self) -> list[str]:
        return [n for n in self.layer_names() if n not in self.seen]

    def finish(self) -> None:
        self.g.unseen = self.unseen()
        if self.g.unseen:
            names = ", ".join(self.g.unseen[:5]) + (", ..." if len(self.g.unseen) > 5 else "")
            warnings.warn(f"{len(self.g.unseen)} layer(s) did not run on the example input (in eval "
                          f"or training mode) and keep all their channels: {names} (the trace follows "
                          "the path the example takes)", stacklevel=3)
        summary = self.g.kept_summary()
        if summary:
            warnings.warn(f"slimming kept channels it cannot follow one by one (the rest is cut "
                          f"exactly): {summary}", stacklevel=3)
        self.maps.clear()
        self.storage.clear()

    def get(self, t) -> Map | None:
        entry = self.maps.get(id(t)) if isinstance(t, torch.Tensor) else None
        return entry[1] if entry is not None and entry[0] is t else None

    def set(self, t: torch.Tensor, m: Map | None) -> None:
        if not isinstance(t, torch.Tensor):
            return
        if m is not None and (m.dim >= t.dim() or t.shape[m.dim] != m.channels * m.factor):
            # a rule's map that does not fit its tensor: those channels are kept, and the
            # tensor followed as channels of its own (never a cut on a guess)
            self.g.pin(m, f"{self.where()}: channels the trace lost track of")
            m = Map([Seg(self.g.new_space(t.shape[1], "lost track"), 0, t.shape[1], False)]) \
                if t.dim() >= 2 else None
        ptr = _memory(t)
        if m is None:
            if self.maps.pop(id(t), None) is not None and ptr:
                self.storage[ptr].discard(id(t))
        else:
            self.maps[id(t)] = (t, m)
            if ptr:
                self.storage[ptr].add(id(t))
            if self.stack:
                self.g.frames.setdefault(self.stack[-1], []).append(m)

    def fresh(self, t: torch.Tensor, why: str, dim: int = 1) -> None:
        """``t`` gets channels of its own along ``dim``, kept whole (None for a tensor without
        channels): what the trace cannot map channel by channel is still followed, so that the
        layers after it are known and cut."""
        if isinstance(t, torch.Tensor):
            dim = dim if 0 < dim < t.dim() else 1
            self.set(t, Map([Seg(self.g.new_space(t.shape[dim], why), 0, t.shape[dim], False)], dim=dim)
                     if t.dim() >= 2 else None)

    def where(self) -> str:
        return self.stack[-1] if self.stack and self.stack[-1] else "the model's forward"

    def pin_tensor(self, t: torch.Tensor, why: str) -> None:
        m = self.get(t)
        if m is not None:
            self.g.pin(m, why)

    def sized(self, sizes: list[int]) -> bool:
        """Whether every size is an integer attribute of the module whose forward is running (so
        that the cut can set it), when sizes are followed at all."""
        if not self.follow_sizes or not self.stack:
            return False
        held = {v for v in vars(self.modules[self.stack[-1]]).values() if type(v) is int}
        return set(sizes) <= held

    def in_ignored(self) -> bool:
        return any(name in self.ignore for name in self.stack)

    def opaque(self, op: str, what: str, inputs: list[Map], out, dim: int | None = None) -> None:
        """An op the graph cannot follow channel by channel: every channel it reads is kept
        (its outputs are then what they were), and each output gets channels of its own (along
        ``dim``; by default where its inputs have theirs), kept whole. Recorded for the warning
        that ``finish`` gives."""
        if dim is None:
            dims = {m.dim for m in inputs}
            dim = dims.pop() if len(dims) == 1 else 1
        where = self.where()
        why = f"{where}: {op} ({what})"
        for m in inputs:
            self.g.pin(m, why)
        kind = type(self.modules.get(where, self.model)).__name__
        self.g.kept.append(Kept(kind, where, op, what, list(inputs)))
        for t in tensors(out):
            self.fresh(t, why, dim)

    # ------------------------------------------------------------------ modules

    def enter(self, name: str, m: nn.Module):
        kind = module_kind(m)

        def hook(module, args):
            self.stack.append(name)
            if name in self.keep_whole:
                for t in tensors(args):
                    self.pin_tensor(t, f"{name} is in keep_whole")
            if kind is not None:
                self.whole += 1
        return hook

    def leave(self, name: str, m: nn.Module):
        kind = module_kind(m)

        def hook(module, args, out):
            if kind is not None:
                self.whole -= 1
                self.whole_layer(name, m, kind, args, out)
            if name in self.ignore:
                for t in tensors(out):
                    self.pin_tensor(t, f"{name} is in ignore")
            for side, values in (("in", args), ("out", out)):
                for t in tensors(values):
                    m_ = self.get(t)
                    if m_ is not None:
                        self.g.borders.setdefault(name, []).append(m_)
                        self.g.sides.setdefault((name, side), []).append(m_)
            if self.stack and self.stack[-1] == name:
                self.stack.pop()
        return hook

    def whole_layer(self, name: str, m: nn.Module, kind: str, args, out) -> None:
        """A module followed whole by the rule of its kind (a frozen BatchNorm, a registered
        layer): it reads its first input's channels and makes (or carries) its output's; its
        other inputs are kept."""
        self.seen.add(name)
        rule = RULES[kind]
        ins = [t for t in tensors(args) if self.get(t) is not None]
        x = self.get(args[0]) if args else None
        for t in ins[1:] if x is not None else ins:
            self.pin_tensor(t, f"{name}: read by a {type(m).__name__} as other than its channels")
        if kind == "head_gate":
            return self.head_gate(name, m, x, out)
        if x is None:
            return self.fresh(out, f"{name}: made from untracked inputs") if isinstance(out, torch.Tensor) \
                else None
        carried = not rule.makes and isinstance(out, torch.Tensor) and out.shape == args[0].shape
        if not isinstance(out, torch.Tensor) or out.dim() < 2 or x.factor != 1 \
                or (x.dim != 1 and not carried):
            return self.opaque(type(m).__name__, "a layer followed whole whose output is not (N, C, ...)",
                               [x], out)
        attrs = {role: role for tensors_ in (rule.reads, rule.makes, rule.carries) for role in tensors_
                 if isinstance(getattr(m, role, None), torch.Tensor)}
        ignored = name in self.ignore or self.in_ignored()
        if rule.makes:
            return self.produce(name, kind, x, out.shape[1], ignored, out, attrs)
        if out.shape[x.dim] != x.channels:
            return self.opaque(type(m).__name__, "a layer that carries its channels but changes their "
                               "number", [x], out)
        if rule.normalises and (x.dim != out.dim() - 1 or "weight" not in attrs
                                or m.weight.shape != (x.channels,)):
            # Kept, not followed: a norm over other than the last dim alone, or without a scale of
            # its own, normalises each channel by statistics of others that no factor scores
            return self.opaque(type(m).__name__, "a normalisation over other than its channels, or "
                               "without a scale of its own", [x], out)
        if ignored:
            self.g.pin(x, f"{name} is in ignore")
        self.again(name, x)
        self.g.uses.append(Use(name, kind, x, attrs))
        self.set(out, x.with_gate(rule.gated and "weight" in attrs))

    def head_gate(self, name: str, m: nn.Module, x: Map | None, out) -> None:
        """A gate per head (``HeadGate``) scores the heads of the attention whose merged heads
        it scales (``graph.heads_of``); its output's channels are its input's. On anything else
        the heads it would score are kept."""
        count = m.weight.numel()
        found = self.g.heads_of(x) if x is not None else None
        if found is None or found[1] != count:
            space = self.g.new_space(count, f"{name}: a gate per head where the trace found no heads")
        else:
            space = found[0]
            if name in self.ignore or self.in_ignored():
                self.g.pin(Map([Seg(space, 0, count, False)]), f"{name} is in ignore")
        self.g.uses.append(Use(name, "head_gate", Map([Seg(space, 0, count, True)]), {"weight": "weight"}))
        self.set(out, x)

    # ------------------------------------------------------------------ ops

    def step(self, func, args, kwargs, out) -> None:
        """One call of the forward: its rule, then what an in-place write did to aliases."""
        op = op_name(func)
        if op in META_OPS:
            return
        target = args[0] if args and isinstance(args[0], torch.Tensor) else None
        writes = target is not None and in_place(func, args, kwargs, out)
        before = self.get(target) if writes else None
        inputs = [(t, self.get(t)) for t in tensors(list(args) + list(kwargs.values()))]
        inputs = [(t, m) for t, m in inputs if m is not None]
        try:
            self.op(op, func, args, kwargs, out, inputs)
        except GraphError:
            raise
        except Exception as e:  # noqa: BLE001 (arguments no rule here expected: kept, not followed)
            self.opaque(op, f"arguments it does not expect: {first_line(e, 80)}", [m for _, m in inputs], out)
        if writes:
            self.written(op, target, before, bool(inputs))

    def written(self, op: str, t: torch.Tensor, before: Map | None, tracked: bool) -> None:
        """After ``op`` wrote into ``t``: where its channels changed, every other tensor sharing
        its memory (the tensor it is a view of, other views, ``detach()`` aliases) changed too;
        their channels are kept. A tracked tensor written into an untracked one (a detection
        transform's ``copy_`` into a fresh batch) gives it, and what it is a view of, channels
        of their own."""
        after = self.get(t)
        if after == before and (after is not None or not tracked):
            return
        why = f"{self.where()}: {op} writes in place through a view or an alias"
        if after is None and tracked:
            self.fresh(t, why)
        for i in list(self.storage.get(_memory(t), ())):
            other = self.maps.get(i)
            if other is not None and other[0] is not t:
                self.g.pin(other[1], why)
                self.set(other[0], other[1].with_gate(False))
        base = t._base
        if base is not None and self.get(base) is None and base.dim() >= 2:
            self.fresh(base, why)

    def op(self, op: str, func, args, kwargs, out, inputs) -> None:
        """The rule for one op, by the dispatch table (``DISPATCH``: op name -> rule);
        ``inputs``: its tracked tensors and their maps."""
        if not inputs:
            if isinstance(out, torch.Tensor) and op != "setitem":
                self.set(out, None)  # a fresh tensor from constants, or one overwritten by them
            return
        op = OP_ALIASES.get(op, op)  # an op of your own, followed as the known one it is like
        rule = DISPATCH.get(op)
        if rule is None:
            return self.opaque(op, "an op it does not know", [m for _, m in inputs], out)
        getattr(self, rule)(op, func, args, kwargs, out, inputs)

    # the rules DISPATCH names, each (op, func, args, kwargs, out, inputs)

    def rule_constant(self, op, func, args, kwargs, out, inputs) -> None:
        self.set(out, None)  # a new tensor of a shape only (new_zeros)

    def rule_layer(self, op, func, args, kwargs, out, inputs) -> None:
        self.layer(op, args, kwargs, out)

    def rule_method(self, op, func, args, kwargs, out, inputs) -> None:
        getattr(self, f"op_{op}")(op, args, kwargs, out, inputs)

    def rule_combine(self, op, func, args, kwargs, out, inputs) -> None:
        self.combine(op, args, out, inputs)

    def rule_reshape(self, op, func, args, kwargs, out, inputs) -> None:
        self.reshape(op, args, kwargs, out, inputs)

    def rule_extremum(self, op, func, args, kwargs, out, inputs) -> None:
        if len(args) > 1 and isinstance(args[1], torch.Tensor):
            return self.combine("maximum", args, out, inputs)  # element-wise, of two tensors
        self.reduce(op, args, kwargs, out, inputs)

    def rule_reduce(self, op, func, args, kwargs, out, inputs) -> None:
        self.reduce(op, args, kwargs, out, inputs)

    def rule_split(self, op, func, args, kwargs, out, inputs) -> None:
        self.split(op, args, kwargs, out, inputs)

    def rule_prelu(self, op, func, args, kwargs, out, inputs) -> None:
        if arg(args, kwargs, 1, "weight").numel() != 1:
            return self.opaque(op, "a PReLU with a slope per channel", [m for _, m in inputs], out)
        self.set(out, inputs[0][1].with_gate(None))  # one slope for all channels: 0 -> 0

    def rule_value(self, op, func, args, kwargs, out, inputs) -> None:
        if tensors(out):  # x.float(): a conversion, element-wise
            return self.rule_elementwise(op, func, args, kwargs, out, inputs)
        for _, m in inputs:
            self.g.pin(m, f"{self.where()}: its values are read by {op}")

    def rule_layer_norm(self, op, func, args, kwargs, out, inputs) -> None:
        """A LayerNorm over the channels, where they lie last (ConvNeXt's channels-last norm and
        its LayerNorm2d, a transformer's over its embedding), with a module's weight: a slimming
        factor that carries the channels; cut, it normalises over the kept ones
        (``slimming.pruning.norms`` says what that promises). Any other: ``rule_norm``."""
        x_t, x = inputs[0]
        shape = arg(args, kwargs, 1, "normalized_shape")
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        given, name, attrs = self.owned(args, kwargs, (("weight", 2), ("bias", 3)))
        if self.stack:
            self.seen.add(self.stack[-1])  # a LayerNorm module without tensors ran too
        if len(inputs) > 1 or len(shape) != 1 or x.factor != 1 or x.dim != x_t.dim() - 1 \
                or attrs is None or "weight" not in attrs or name in self.ignore or self.in_ignored() \
                or not isinstance(out, torch.Tensor) or out.shape != x_t.shape \
                or not isinstance(self.modules.get(name), nn.LayerNorm):
            return self.rule_norm(op, func, args, kwargs, out, inputs)
        self.again(name, x)
        self.g.uses.append(Use(name, "layer_norm", x, attrs))
        self.set(out, x.with_gate(True))

    def rule_norm(self, op, func, args, kwargs, out, inputs) -> None:
        # Kept, not followed: a norm over the channels without a scale of its own (a LayerNorm
        # over several dims or in ignore, an rms_norm outside an nn.RMSNorm) normalises each
        # channel by statistics of all the others, so cutting one changes what the rest become
        # (a LayerNorm with its weight: rule_layer_norm; an nn.RMSNorm is a layer followed whole
        # by its rule; GroupNorm, by whole groups: rule_group_norm)
        x_t, x = inputs[0]
        same = isinstance(out, torch.Tensor) and out.shape == x_t.shape
        self.opaque(op, "a normalisation over the channels: cutting one changes the others",
                    [m for _, m in inputs], out, x.dim if same else 1)

    def rule_group_norm(self, op, func, args, kwargs, out, inputs) -> None:
        """GroupNorm normalises each group of channels on its own: it carries the channels, cut
        by whole groups (the others' statistics stay as they were). Its scale, a module's
        weight, is a slimming factor: scored like a BatchNorm's gamma, and zero out where it and
        the bias are zeroed; without one, a group of zeros stays zero unless a bias moves it."""
        x_t, x = inputs[0]
        given, name, attrs = self.owned(args, kwargs, (("weight", 2), ("bias", 3)))
        groups = arg(args, kwargs, 1, "num_groups")
        if x.factor != 1 or x.dim != 1 or len(inputs) > 1 or (given and attrs is None) \
                or not isinstance(groups, int) or x.channels % groups:
            return self.opaque(op, "a GroupNorm of other than one module's channels",
                               [m for _, m in inputs], out)
        if self.stack:
            self.seen.add(self.stack[-1])
            if name is None and not given and isinstance(self.modules[self.stack[-1]], nn.GroupNorm):
                name, attrs = self.stack[-1], {}  # affine=False: its num_groups still follows
        self.g.whole_blocks(x, groups)
        bias = given.get("bias")
        if name is not None and (name in self.ignore or self.in_ignored()):
            self.g.pin(x, f"{name} is in ignore")
        if name is not None:
            self.again(name, x)
            self.g.uses.append(Use(name, "group_norm", x, attrs))
        if name is not None and "weight" in attrs:
            return self.set(out, x.with_gate(True))
        self.set(out, x.with_gate(None if bias is None or not bool(bias.ne(0).any()) else False))

    def rule_instance_norm(self, op, func, args, kwargs, out, inputs) -> None:
        """InstanceNorm normalises every channel on its own: it carries the channels (its affine
        tensors, if any, cut with them); a zero stays zero unless its bias moves it."""
        x_t, x = inputs[0]
        given, name, attrs = self.owned(args, kwargs, NORM_ROLES)
        if x.factor != 1 or x.dim != 1 or len(inputs) > 1 or (given and attrs is None):
            return self.opaque(op, "an InstanceNorm of other than one module's channels",
                               [m for _, m in inputs], out)
        bias = given.get("bias")
        if self.stack:
            self.seen.add(self.stack[-1])  # an InstanceNorm module without tensors ran too
        if name is not None:
            self.again(name, x)
            self.g.uses.append(Use(name, "instance_norm", x, attrs))
        self.set(out, x.with_gate(None if bias is None or not bool(bias.ne(0).any()) else False))

    def rule_elementwise(self, op, func, args, kwargs, out, inputs) -> None:
        x_t, x = inputs[0]
        d = x.dim
        same = isinstance(out, torch.Tensor) and out.dim() == x_t.dim() and out.shape[0] == x_t.shape[0] \
            and out.shape[d] == x_t.shape[d] \
            and (d == 1 or op not in SPATIAL_OPS or _pads_around(op, args, kwargs, x_t, d))
        if len(inputs) > 1 or not same:
            return self.opaque(op, "an op of several tensors" if len(inputs) > 1 else "a change of shape",
                               [m for _, m in inputs], out)
        if op in ELEMENTWISE:
            zero = keeps_zero(func, args, kwargs, x_t)
        else:
            padded = op == "pad" and arg(args, kwargs, 3, "value", 0) not in (0, None)
            zero = op in ZERO_OPS and not padded
        self.set(out, x.with_gate(None if zero else False))

    def layer(self, op: str, args, kwargs, out) -> None:
        """A convolution, linear layer or BatchNorm, known by its tensors: every one of them a
        parameter or buffer of one module (whose tensors of those names are then cut)."""
        x_t = args[0] if args else kwargs.get("input")
        x = self.get(x_t)
        given, name, attrs = self.owned(args, kwargs, NORM_ROLES if op == "batch_norm" else LAYER_ROLES)
        if x is None:  # a layer of something made from constants: its outputs are kept
            return self.fresh(out, f"{name or op}: reads no tracked channels")
        if attrs is None or not given:
            return self.opaque(op, "a layer whose tensors are not one module's parameters", [x], out)
        ignored = name in self.ignore or self.in_ignored()
        if op == "linear":  # reads the last dim: (N, features), or tokens (N, L, C), channels-last
            if x.dim != x_t.dim() - 1 or (x.factor != 1 and x_t.dim() != 2):
                return self.opaque(op, "a linear layer over other than its input's channels", [x], out)
            return self.produce(name, "linear", x, out.shape[-1], ignored, out, attrs, dim=out.dim() - 1)
        if x.dim != 1:
            return self.opaque(op, "a convolution or BatchNorm of channels-last channels", [x], out)
        if op == "batch_norm":
            if x.factor != 1 or not isinstance(out, torch.Tensor) or out.dim() < 2:
                return self.opaque(op, "a BatchNorm of flattened channels", [x], out)
            if ignored:
                self.g.pin(x, f"{name} is in ignore")
            self.again(name, x)
            self.g.uses.append(Use(name, "bn", x, attrs))
            return self.set(out, x.with_gate("weight" in attrs))
        if x.factor != 1:
            return self.opaque(op, "a convolution of a flattened tensor", [x], out)
        groups = arg(args, kwargs, 6, "groups", 1)
        cin, cout = x_t.shape[1], out.shape[1]
        if op in TRANSPOSED:
            if groups != 1:
                self.g.pin(x, f"the grouped transposed convolution {name}")
                return self.produce(name, "convt", x, cout, True, out, attrs)
            return self.produce(name, "convt", x, cout, ignored, out, attrs)
        if groups == 1:
            return self.produce(name, "conv", x, cout, ignored, out, attrs)
        if groups == cin == cout and not ignored:  # depthwise: channel c -> channel c
            self.again(name, x)
            self.g.uses.append(Use(name, "depthwise", x, attrs))
            if self.stack and self.stack[-1] == name:  # F.conv2d(x, self.filt, groups=C) in a module:
                self.g.group_counts.setdefault(name, []).append((groups, x))  # its groups follow x
            return self.set(out, x.with_gate(None if "bias" not in attrs else False))
        # grouped: every group keeps the same number of input and of output channels
        self.g.equal_blocks(x, groups, "groups")
        space = self.produce(name, "conv", x, cout, ignored, out, attrs, groups)
        self.g.equal_blocks(Map([Seg(space, 0, cout, False)]), groups, "groups")

    def owned(self, args, kwargs, roles) -> tuple[dict, str | None, dict | None]:
        """The tensors a layer op was called with, by part ({"weight": ..., ...}), the module
        they belong to (marked as run) and which of its attributes each is; attrs None when
        they are not all one module's parameters or buffers."""
        given = {role: arg(args, kwargs, i, role) for role, i in roles}
        given = {role: t for role, t in given.items() if isinstance(t, torch.Tensor)}
        owners = {role: self.owner.get(id(t)) for role, t in given.items()}
        names = {o[0] for o in owners.values() if o is not None}
        name = next(iter(names)) if len(names) == 1 else None
        if name is not None:
            self.seen.add(name)
        attrs = {role: o[1] for role, o in owners.items()} if name and None not in owners.values() else None
        return given, name, attrs

    def channel_tensor(self, t: torch.Tensor, c: int, dim: int | None = None) -> tuple[str, str, int] | None:
        """(module, attribute, dim) when ``t`` is a module's parameter or buffer of ``c``
        values (or a view of one: ``gamma.view(1, -1, 1, 1)``), one per channel along ``dim``;
        or, where ``t``'s channels lie along ``dim``, a parameter with other dims too (a
        position embedding (1, L, C)) or a broadcast of one (a class token expanded to
        (N, 1, C)). Inside a module in ``ignore``, None (kept)."""
        base = t if id(t) in self.owner else t._base
        if base is None or id(base) not in self.owner or self.in_ignored():
            return None
        if base.numel() == c:
            dims = [i for i, n in enumerate(base.shape) if n == c]
            return (*self.owner[id(base)], dims[0]) if len(dims) == 1 else None
        if dim is None or base.dim() != t.dim() or not 0 <= dim < t.dim() or base.shape[dim] != c \
                or t.shape[dim] != c:
            return None
        for i, (n, b) in enumerate(zip(t.shape, base.shape)):  # ``base`` itself, or expanded
            if b != 1 and (b != n or t.stride(i) != base.stride(i)):
                return None
        return (*self.owner[id(base)], dim)

    def scale(self, module: str, attr: str, dim: int, x: Map) -> None:
        """A per-channel parameter of ``module`` (a layer scale) applied to channels ``x``: cut
        with them (a second use reads the same channels: tied)."""
        self.seen.add(module)
        if self.again(f"{module}#{attr}", x) is None:
            self.g.uses.append(Use(module, "scale", x, {"weight": attr}, dim))

    def again(self, name: str, x: Map) -> int | None:
        """A layer called more than once reads the same channels each time: its inputs are tied
        to its first call's. Returns its output space when it made one before."""
        first = self.made.get(name)
        if first is None:
            self.made[name] = (None, x)
            return None
        self.g.tie(first[1], x, f"{name} is called on channels it cannot pair with its first call's")
        return first[0]

    def produce(self, name: str, kind: str, x: Map, width: int, ignored: bool, out, attrs,
                groups: int = 1, dim: int = 1) -> int:
        """A layer reading ``x`` and making ``width`` channels of a space of its own (kept whole
        when ``ignored``; the channels it reads too, inside a module in ``keep_whole``)."""
        why = f"{name} is in ignore" if ignored else ""
        if any(n in self.keep_whole for n in self.stack) or name in self.keep_whole:
            self.g.pin(x, f"{name} is in keep_whole")
        space = self.again(name, x)
        if space is None:
            space = self.g.new_space(width, why)
            self.made[name] = (space, x)
            self.g.uses.append(Use(name, f"{kind}_out", Map([Seg(space, 0, width, False)]), attrs, groups))
        self.g.uses.append(Use(name, f"{kind}_in", x, attrs, groups))
        self.set(out, Map([Seg(space, 0, width, False)], dim=dim))
        return space


def _dispatch() -> dict[str, str]:
    """op name -> the walk's rule for it; a later line wins where the tables share a name."""
    table: dict[str, str] = {}
    for ops, rule in ((ZERO_OPS | PASS_OPS | ELEMENTWISE, "rule_elementwise"), (VALUE_OPS, "rule_value"),
                      (SPLIT_OPS, "rule_split"), (REDUCE_OPS, "rule_reduce"),
                      ({"max", "min"}, "rule_extremum"), (RESHAPE_OPS, "rule_reshape"),
                      (SUM_OPS | PRODUCT_OPS | {"div"}, "rule_combine"), (NORM_OPS, "rule_norm"),
                      ({"prelu"}, "rule_prelu"), ({"instance_norm"}, "rule_instance_norm"),
                      ({"group_norm"}, "rule_group_norm"), ({"layer_norm"}, "rule_layer_norm"),
                      ({n[3:] for n in dir(ChannelOps) if n.startswith("op_")}, "rule_method"),
                      (LAYERS, "rule_layer"), (CONSTANT_OPS, "rule_constant")):
        table.update(dict.fromkeys(ops, rule))
    return table


DISPATCH = _dispatch()
OP_ALIASES: dict[str, str] = {}  # an op's name -> the known op it is followed as (register_op)


def register_op(name: str, like: str) -> Registration:
    """Follow the torch op ``name`` (a ``torch.library`` custom op's name, ``"swish"`` for
    ``mylib::swish``, or any torch function the trace does not know) as the known op ``like``
    (``"silu"``: element-wise, a zero stays zero if it does on a zero; ``"add"``: a sum that ties
    its inputs; ``"cat"``, ``"view"``, ...): without it, an op the trace does not know keeps every
    channel it reads. Returns a handle: ``.remove()`` or a ``with`` block undoes it."""
    if not isinstance(name, str) or not name or name in DISPATCH:
        raise SlimmingError(f"register_op takes the name of an op the trace does not know, not {name!r}",
                            param="name")
    if like not in DISPATCH:
        raise SlimmingError(f"register_op: {like!r} is not an op the trace knows (like='silu', 'add', "
                            "'cat', 'view', ...)", param="like")
    registration = Registration(name, [(OP_ALIASES, name, OP_ALIASES.get(name))])
    OP_ALIASES[name] = like
    return registration


def _pads_around(op: str, args, kwargs, x: torch.Tensor, d: int) -> bool:
    """Whether ``op`` is a ``pad`` that leaves dim ``d`` (channels-last channels) as it is:
    pads other dims only (a Swin window's spatial padding of (N, H, W, C))."""
    pad = arg(args, kwargs, 1, "pad")
    if op != "pad" or not isinstance(pad, (tuple, list)) or len(pad) % 2:
        return False
    padded = {x.dim() - 1 - i for i in range(len(pad) // 2) if pad[2 * i] or pad[2 * i + 1]}
    return d not in padded


def _memory(t: torch.Tensor) -> int:
    """The address of ``t``'s memory (0 when it has none to share)."""
    try:
        return t.untyped_storage().data_ptr()
    except Exception:  # noqa: BLE001 (tensor subclasses without storage)
        return 0
