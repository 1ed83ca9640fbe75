"""``trace``: the channel graph of a network (``slimming.pruning.graph``), built by running one
real forward of the example input in eval mode and watching every torch function it calls.

Why a ``TorchFunctionMode`` rather than torch.fx or the autograd graph: a real forward follows
any Python the network's authors wrote (loops and lists over ``chunk``, shape checks, layers
picked by index, dict and nested outputs), which torch.fx refuses; every torch function and
tensor method is seen with its real arguments (``dim``, slice bounds, split sizes), which the
autograd graph does not keep, and no graph of gradients is built. Convolutions, BatchNorms and
linear layers are recognised by their parameters (a module's weight passed to ``F.conv2d`` is
that module, called as a module or not); forward hooks keep the stack of modules for messages
and ``ignore``, and bracket the modules followed whole (``FrozenBatchNorm2d``).

The trace follows the path the example input takes: a branch the example does not take is not
seen. An all-zero example (``prune``'s default) carries no values to follow, so there the
convolutions' arithmetic, most of a forward's time, is skipped: ``nn.Conv2d`` gives zeros of
the shape it would give (with a real image as the example, everything is computed). Every
convolution, BatchNorm or linear layer the forward never ran keeps all its channels and is
named in a warning. What cannot be followed is one ``GraphError`` naming the module and
the op; the model is left as it was. Inside a module in ``ignore`` (a detection head and its
decoding), and on tensors whose channels are all pinned anyway, any op is followed as opaque:
its inputs keep their channels, so its outputs are what they were. What each op does to the
channels (the tables and the rules for sums, concatenations, reshapes, splits and indexing) is
in ``slimming.pruning.ops``; the layers (convolutions, BatchNorms, linear) are here.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from ..errors import first_line
from .graph import ChannelGraph, GraphError, Map, Seg, Use, ignored_names
from .ops import (
    CONSTANT_OPS,
    META_OPS,
    PASS_OPS,
    PRODUCT_OPS,
    REDUCE_OPS,
    RESHAPE_OPS,
    SPLIT_OPS,
    SUM_OPS,
    VALUE_OPS,
    ZERO_OPS,
    ChannelOps,
    arg,
    op_name,
    tensors,
)

FROZEN = {"FrozenBatchNorm2d"}  # per-channel modules followed whole, by class name (any library)
BN = nn.modules.batchnorm._BatchNorm


def _conv_shape(args, kwargs) -> torch.Tensor | None:
    """Zeros of the shape ``F.conv2d`` would give (None where the arguments are not the plain
    ones): what a blank example needs of a convolution, without its arithmetic."""
    if kwargs or len(args) != 7 or not isinstance(args[0], torch.Tensor) or args[0].dim() != 4:
        return None
    x, w, _, stride, padding, dilation, groups = args
    if not all(isinstance(v, (tuple, list)) and len(v) == 2 for v in (stride, padding, dilation)) \
            or x.shape[1] != w.shape[1] * groups:
        return None
    size = [(n + 2 * p - d * (k - 1) - 1) // s + 1 for n, p, d, k, s in
            zip(x.shape[2:], padding, dilation, w.shape[2:], stride)]
    return x.new_zeros(x.shape[0], w.shape[0], *size) if min(size) > 0 else None


class _Mode(TorchFunctionMode):
    """Hands every torch call of the forward, after running it, to the walk."""

    def __init__(self, walk: _Walk):
        super().__init__()
        self.walk = walk

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = _conv_shape(args, kwargs) if self.walk.blank and func is torch.conv2d else None
        out = func(*args, **kwargs) if out is None else out
        if not self.walk.whole:
            try:
                self.walk.op(func, args, kwargs, out)
            except GraphError:
                raise
            except Exception as e:  # arguments no rule here expected: the op is not followed
                why = f"arguments it does not expect: {first_line(e, 80)}"
                raise self.walk.fail(op_name(func), why) from None
        return out


def trace(model: nn.Module, example_inputs: torch.Tensor, ignore=()) -> ChannelGraph:
    """Run ``model`` (left unchanged, its train/eval mode restored) once on ``example_inputs``
    (N, C, H, W) in eval mode and build its channel graph. ``ignore``: modules whose channels
    must all be kept, by name (a name keeps what is inside it too) or by type
    (``ignored_names``). Raises GraphError (one line, naming the module and the op) for what it
    cannot follow."""
    keep = ignored_names(model, ignore)
    if not isinstance(example_inputs, torch.Tensor) or example_inputs.dim() != 4:
        shape = tuple(example_inputs.shape) if isinstance(example_inputs, torch.Tensor) else None
        raise GraphError(f"the model's input is {shape}, not an image batch (N, C, H, W)")
    walk = _Walk(model, keep)
    was_training = model.training
    hooks = []
    try:
        for name, m in model.named_modules():
            hooks.append(m.register_forward_pre_hook(walk.enter(name, m)))
            hooks.append(m.register_forward_hook(walk.leave(name, m)))
        model.eval()
        walk.start(example_inputs)
        try:
            with torch.no_grad(), _Mode(walk):
                out = model(example_inputs)
        except GraphError:
            raise
        except Exception as e:
            raise GraphError(f"{type(model).__name__} does not run on example_inputs of shape "
                             f"{tuple(example_inputs.shape)}: {first_line(e, 160)}") from None
        for t in tensors(out):
            walk.pin_tensor(t, "the model's output")
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)
    walk.finish()
    return walk.g


class _Walk(ChannelOps):
    """The channel maps of the forward's tensors, and the graph they build."""

    def __init__(self, model: nn.Module, ignore: set[str]):
        self.model, self.ignore = model, ignore
        self.g = ChannelGraph(model)
        self.maps: dict[int, tuple[torch.Tensor, Map]] = {}  # id -> (tensor kept alive, map)
        self.stack: list[str] = []
        self.whole = 0  # > 0 inside a module followed whole
        self.owner: dict[int, str] = {}  # id of a parameter or buffer -> its module's name
        for name, m in model.named_modules():
            for t in (*m._parameters.values(), *m._buffers.values()):
                if t is not None:
                    self.owner.setdefault(id(t), name)
        self.seen: set[str] = set()
        self.blank = False  # an all-zero example: convolutions give zeros of their shape

    # ------------------------------------------------------------------ bookkeeping

    def start(self, x: torch.Tensor) -> None:
        self.blank = not bool(x.any())
        self.set(x, Map([Seg(self.g.new_space(x.shape[1], "the input image"), 0, x.shape[1], False)]))

    def finish(self) -> None:
        layers = [name for name, m in self.model.named_modules()
                  if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d, nn.Linear, BN))
                  or type(m).__name__ in FROZEN]
        self.g.unseen = [n for n in layers if n not in self.seen]
        if self.g.unseen:
            names = ", ".join(self.g.unseen[:5]) + (", ..." if len(self.g.unseen) > 5 else "")
            warnings.warn(f"{len(self.g.unseen)} layer(s) did not run on the example input and keep "
                          f"all their channels: {names} (the trace follows the path the example "
                          "takes)", stacklevel=3)
        self.maps.clear()

    def get(self, t) -> Map | None:
        entry = self.maps.get(id(t)) if isinstance(t, torch.Tensor) else None
        return entry[1] if entry is not None and entry[0] is t else None

    def set(self, t: torch.Tensor, m: Map | None) -> None:
        if m is None:
            self.maps.pop(id(t), None)
        else:
            self.maps[id(t)] = (t, m)

    def where(self) -> str:
        return self.stack[-1] if self.stack and self.stack[-1] else "the model's forward"

    def pin_tensor(self, t: torch.Tensor, why: str) -> None:
        m = self.get(t)
        if m is not None:
            self.g.pin(m, why)

    def in_ignored(self) -> bool:
        return any(name in self.ignore for name in self.stack)

    def fail(self, op: str, what: str) -> GraphError:
        return GraphError(f"{self.where()}: slimming cannot follow the channels through {op} "
                          f"({what}); list the module in ignore= or simplify it")

    def opaque(self, op: str, what: str, inputs: list[Map], out) -> None:
        """An op the graph cannot follow: fine where its inputs' channels are all pinned (its
        outputs are then what they were; each gets channels of its own, pinned), else a
        GraphError."""
        if not self.in_ignored() and not all(self.g.pinned_everywhere(m) for m in inputs):
            raise self.fail(op, what)
        why = f"{self.where()}: made by {op}, which slimming follows as opaque"
        for t in tensors(out):
            if t.dim() >= 2:
                self.set(t, Map([Seg(self.g.new_space(t.shape[1], why), 0, t.shape[1], False)]))
            else:
                self.set(t, None)

    # ------------------------------------------------------------------ modules

    def enter(self, name: str, m: nn.Module):
        def hook(module, args):
            self.stack.append(name)
            if name in self.ignore:
                for t in tensors(args):
                    self.pin_tensor(t, f"{name} is in ignore")
            if type(m).__name__ in FROZEN:
                self.whole += 1
        return hook

    def leave(self, name: str, m: nn.Module):
        def hook(module, args, out):
            if type(m).__name__ in FROZEN:
                self.whole -= 1
                self.seen.add(name)
                x = self.get(args[0]) if args else None
                if x is not None and isinstance(out, torch.Tensor) and out.dim() == 4 and x.factor == 1:
                    if name in self.ignore:
                        self.g.pin(x, f"{name} is in ignore")
                    else:
                        self.g.uses.append(Use(name, "frozen_bn", x))
                    self.set(out, x.with_gate(False))
                elif x is not None:
                    raise self.fail(type(m).__name__, "a frozen BatchNorm of something other than "
                                    "(N, C, H, W) channels")
            if name in self.ignore:
                for t in tensors(out):
                    self.pin_tensor(t, f"{name} is in ignore")
            if self.stack and self.stack[-1] == name:
                self.stack.pop()
        return hook

    # ------------------------------------------------------------------ ops

    def op(self, func, args, kwargs, out) -> None:
        op = op_name(func)
        if op in META_OPS:
            return
        inputs = [(t, self.get(t)) for t in tensors(list(args) + list(kwargs.values()))]
        inputs = [(t, m) for t, m in inputs if m is not None]
        if not inputs:
            if isinstance(out, torch.Tensor) and out is not None:
                self.set(out, None)  # a fresh tensor from constants, or one overwritten by them
            return
        handler = getattr(self, f"op_{op}", None)
        if op in CONSTANT_OPS:
            self.set(out, None)
        elif op in ("conv2d", "conv_transpose2d", "linear", "batch_norm"):
            self.layer(op, args, kwargs, out)
        elif handler is not None:
            handler(op, args, kwargs, out, inputs)
        elif op in SUM_OPS or op in PRODUCT_OPS or op == "div":
            self.combine(op, args, out, inputs)
        elif op in RESHAPE_OPS:
            self.reshape(op, args, kwargs, out, inputs)
        elif op in ("max", "min") and len(args) > 1 and isinstance(args[1], torch.Tensor):
            self.combine("maximum", args, out, inputs)  # element-wise, of two tensors
        elif op == "prelu" and arg(args, kwargs, 1, "weight").numel() == 1:
            self.set(out, inputs[0][1].with_gate(None))  # one slope for all channels: 0 -> 0
        elif op in REDUCE_OPS:
            self.reduce(op, out, inputs)
        elif op in SPLIT_OPS:
            self.split(op, args, kwargs, out, inputs)
        elif op in VALUE_OPS and not tensors(out):
            for _, m in inputs:
                self.g.pin(m, f"{self.where()}: its values are read by {op}")
        elif op in ZERO_OPS or op in PASS_OPS:
            x = inputs[0][1]
            same = isinstance(out, torch.Tensor) and out.shape[:2] == inputs[0][0].shape[:2]
            if len(inputs) > 1 or not same:
                self.opaque(op, "an op of several tensors" if len(inputs) > 1 else "a change of shape",
                            [m for _, m in inputs], out)
                return
            zero = op in ZERO_OPS and not (op == "pad" and arg(args, kwargs, 3, "value", 0) not in (0, None))
            self.set(out, x.with_gate(None if zero else False))
        else:
            self.opaque(op, "an op it does not know", [m for _, m in inputs], out)

    def layer(self, op: str, args, kwargs, out) -> None:
        """A convolution, linear layer or BatchNorm, known by its parameters."""
        x_t = args[0] if args else kwargs.get("input")
        x = self.get(x_t)
        weight = arg(args, kwargs, 3 if op == "batch_norm" else 1, "weight")
        probe = weight if weight is not None else arg(args, kwargs, 1, "running_mean")
        name = self.owner.get(id(probe))
        if name is not None:
            self.seen.add(name)
        if x is None:  # a layer of something untracked (a weight computed from parameters)
            self.set(out, None)
            return
        if name is None:
            return self.opaque(op, "a layer whose weight is no module's parameter", [x], out)
        ignored = name in self.ignore or self.in_ignored()
        if op == "batch_norm":
            if x.factor != 1 or out.dim() != 4:
                return self.opaque(op, "a BatchNorm of something other than (N, C, H, W) channels", [x], out)
            if ignored:
                self.g.pin(x, f"{name} is in ignore")
            self.g.uses.append(Use(name, "bn", x))
            return self.set(out, x.with_gate(weight is not None))
        if op == "linear":
            if out.dim() != 2:
                return self.opaque(op, "a linear layer on more than (N, features)", [x], out)
            return self.produce(name, "linear", x, out.shape[1], ignored, out)
        if x.factor != 1:
            return self.opaque(op, "a convolution of a flattened tensor", [x], out)
        groups = arg(args, kwargs, 6, "groups", 1)
        cin, cout = x_t.shape[1], out.shape[1]
        if op == "conv_transpose2d":
            if groups != 1:
                self.g.pin(x, f"the grouped transposed convolution {name}")
                return self.produce(name, "convt", x, cout, True, out)
            return self.produce(name, "convt", x, cout, ignored, out)
        if groups == 1:
            return self.produce(name, "conv", x, cout, ignored, out)
        if groups == cin == cout and not ignored:  # depthwise: channel c -> channel c
            self.g.uses.append(Use(name, "depthwise", x))
            return self.set(out, x.with_gate(None if arg(args, kwargs, 2, "bias") is None else False))
        # grouped: every group keeps the same number of input and of output channels
        self.g.equal_blocks(x, groups, "groups")
        space = self.produce(name, "conv", x, cout, ignored, out)
        self.g.equal_blocks(Map([Seg(space, 0, cout, False)]), groups, "groups")

    def produce(self, name: str, kind: str, x: Map, width: int, ignored: bool, out) -> int:
        """A layer reading ``x`` and making ``width`` channels of a space of its own."""
        why = f"{name} is in ignore" if ignored else ""
        if ignored:
            self.g.pin(x, why)
        space = self.g.new_space(width, why)
        self.g.uses.append(Use(name, f"{kind}_in", x))
        self.g.uses.append(Use(name, f"{kind}_out", Map([Seg(space, 0, width, False)])))
        self.set(out, Map([Seg(space, 0, width, False)]))
        return space
