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
its inputs keep their channels, so its outputs are what they were.
"""

from __future__ import annotations

import math
import warnings

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from ..errors import first_line
from .graph import ChannelGraph, GraphError, Map, Seg, Use, ignored_names

# Element-wise or per-channel ops that map zero to zero (a zeroed channel stays zero) ...
ZERO_OPS = {"relu", "relu6", "silu", "gelu", "hardswish", "leaky_relu", "elu", "mish", "tanh",
            "dropout", "dropout2d", "feature_dropout", "adaptive_avg_pool2d", "adaptive_max_pool2d",
            "avg_pool2d", "max_pool2d", "interpolate", "upsample", "upsample_nearest2d",
            "upsample_bilinear2d", "pad", "contiguous", "clone", "float", "half", "bfloat16", "to",
            "type", "detach", "neg", "abs", "hardtanh", "sin", "tanhshrink", "softsign",
            "square", "sqrt", "pixel_unshuffle", "adaptive_avg_pool1d",
            "avg_pool1d", "max_pool1d", "alpha_dropout", "cpu", "cuda", "type_as"}
# ... and those that pass the channel but not its zero (sigmoid(0) = 0.5)
PASS_OPS = {"sigmoid", "hardsigmoid", "softplus", "exp", "log_sigmoid", "selu", "celu", "add_scalar",
            "clamp", "clip", "clamp_min", "reciprocal", "log", "rsqrt", "pow"}
# Results about a tensor, not its values
META_OPS = {"get", "size", "dim", "numel", "shape", "is_floating_point", "is_contiguous", "element_size",
            "stride", "data_ptr", "get_device", "is_complex", "storage_offset", "ndimension", "nelement",
            "has_names", "names", "dtype", "device", "is_cuda", "layout", "requires_grad_", "len",
            "format", "repr", "hash"}
VALUE_OPS = {"item", "tolist", "bool", "float", "int"}  # a tensor's values, read by Python
CONSTANT_OPS = {"new_zeros", "new_ones", "new_full", "new_empty", "new_tensor"}  # shape only
SUM_OPS = {"add", "sub", "maximum", "minimum", "fmax", "fmin"}
PRODUCT_OPS = {"mul", "multiply"}
RESHAPE_OPS = {"view", "reshape", "flatten", "squeeze", "unsqueeze", "permute", "transpose",
               "view_as", "reshape_as", "expand", "expand_as", "movedim", "swapaxes", "mT"}
REDUCE_OPS = {"mean", "sum", "amax", "amin", "max", "min", "std", "var", "norm", "logsumexp", "prod"}
SPLIT_OPS = {"chunk", "split", "tensor_split", "unbind", "split_with_sizes", "hsplit"}
FROZEN = {"FrozenBatchNorm2d"}  # per-channel modules followed whole, by class name (any library)
BN = nn.modules.batchnorm._BatchNorm


def _name(func) -> str:
    """``Tensor.__radd__`` -> ``add``, ``relu_`` -> ``relu``, ``_max_pool2d`` -> ``max_pool2d``."""
    name = getattr(func, "__name__", str(func)).strip("_")
    for prefix in ("r", "i"):
        if name.startswith(prefix) and name[1:] in SUM_OPS | PRODUCT_OPS | {"truediv", "div"}:
            return name[1:]
    return {"truediv": "div", "concat": "cat", "concatenate": "cat"}.get(name, name)


def _arg(args, kwargs, i: int, key: str, default=None):
    if key in kwargs:
        return kwargs[key]
    return args[i] if len(args) > i else default


def _tensors(value) -> list[torch.Tensor]:
    """The tensors in a (nested) list, tuple or dict."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


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
                raise self.walk.fail(_name(func), why) from None
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
        for t in _tensors(out):
            walk.pin_tensor(t, "the model's output")
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)
    walk.finish()
    return walk.g


class _Walk:
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
        for t in _tensors(out):
            if t.dim() >= 2:
                self.set(t, Map([Seg(self.g.new_space(t.shape[1], why), 0, t.shape[1], False)]))
            else:
                self.set(t, None)

    # ------------------------------------------------------------------ modules

    def enter(self, name: str, m: nn.Module):
        def hook(module, args):
            self.stack.append(name)
            if name in self.ignore:
                for t in _tensors(args):
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
                for t in _tensors(out):
                    self.pin_tensor(t, f"{name} is in ignore")
            if self.stack and self.stack[-1] == name:
                self.stack.pop()
        return hook

    # ------------------------------------------------------------------ ops

    def op(self, func, args, kwargs, out) -> None:
        op = _name(func)
        if op in META_OPS:
            return
        inputs = [(t, self.get(t)) for t in _tensors(list(args) + list(kwargs.values()))]
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
        elif op == "prelu" and _arg(args, kwargs, 1, "weight").numel() == 1:
            self.set(out, inputs[0][1].with_gate(None))  # one slope for all channels: 0 -> 0
        elif op in REDUCE_OPS:
            self.reduce(op, out, inputs)
        elif op in SPLIT_OPS:
            self.split(op, args, kwargs, out, inputs)
        elif op in VALUE_OPS and not _tensors(out):
            for _, m in inputs:
                self.g.pin(m, f"{self.where()}: its values are read by {op}")
        elif op in ZERO_OPS or op in PASS_OPS:
            x = inputs[0][1]
            same = isinstance(out, torch.Tensor) and out.shape[:2] == inputs[0][0].shape[:2]
            if len(inputs) > 1 or not same:
                self.opaque(op, "an op of several tensors" if len(inputs) > 1 else "a change of shape",
                            [m for _, m in inputs], out)
                return
            zero = op in ZERO_OPS and not (op == "pad" and _arg(args, kwargs, 3, "value", 0) not in (0, None))
            self.set(out, x.with_gate(None if zero else False))
        else:
            self.opaque(op, "an op it does not know", [m for _, m in inputs], out)

    def layer(self, op: str, args, kwargs, out) -> None:
        """A convolution, linear layer or BatchNorm, known by its parameters."""
        x_t = args[0] if args else kwargs.get("input")
        x = self.get(x_t)
        weight = _arg(args, kwargs, 3 if op == "batch_norm" else 1, "weight")
        probe = weight if weight is not None else _arg(args, kwargs, 1, "running_mean")
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
        groups = _arg(args, kwargs, 6, "groups", 1)
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
            return self.set(out, x.with_gate(None if _arg(args, kwargs, 2, "bias") is None else False))
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

    def combine(self, op: str, args, out, inputs) -> None:
        """A sum or product: operands of the output's channel count are tied; one channel or a
        number broadcasts (a product keeps zeros, a sum does not)."""
        maps = [m for _, m in inputs]
        if not isinstance(out, torch.Tensor) or out.dim() < 2:
            return self.opaque(op, "a result without channels", maps, out)
        c = out.shape[1]
        full, broadcast = [], False
        for a in args[:2]:
            m = self.get(a)
            if m is not None:
                if a.dim() != out.dim():
                    return self.opaque(op, "operands of different ranks", maps, out)
                if m.channels * m.factor == c:
                    full.append(m)
                else:  # one channel broadcast over many: it must keep its one channel
                    self.g.pin(m, f"{self.where()}: broadcast over channels by {op}")
                    broadcast = True
            elif isinstance(a, torch.Tensor):
                lead = a.dim() - out.dim() + 1
                if lead >= 0 and a.shape[lead] == c > 1:
                    return self.opaque(op, "an op with a parameter or buffer over the channels", maps, out)
                broadcast = True
            elif isinstance(a, (int, float)):
                broadcast = broadcast or op in SUM_OPS
        if not full or (op == "div" and self.get(args[1]) is not None):
            return self.opaque(op, "an op whose channels it cannot pair", maps, out)
        result = full[0]
        for m in full[1:]:
            result = self.g.tie(result, m, f"{self.where()}: {op} of channels it cannot pair one by one",
                                product=op in PRODUCT_OPS)
        gated = None if not broadcast or op in PRODUCT_OPS or op == "div" else False
        self.set(out, result.with_gate(gated))

    def reshape(self, op: str, args, kwargs, out, inputs) -> None:
        """Shape changes that keep dims 0 and 1, or flatten (N, C, ...) to (N, C*k)."""
        x_t, x = inputs[0]
        before, after = tuple(x_t.shape), tuple(out.shape) if isinstance(out, torch.Tensor) else None
        if after is None or len(inputs) > 1:
            return self.opaque(op, "a reshape of several tensors", [x], out)
        moves = op in ("permute", "transpose", "swapaxes", "movedim", "mT")
        if moves and not _keeps_channels(op, args, kwargs, len(before)):
            return self.opaque(op, "a permutation that moves the channels", [x], out)
        if len(before) >= 2 and len(after) >= 2 and before[:2] == after[:2] and \
                (x.factor == 1 or len(after) == 2):
            return self.set(out, x)
        if len(before) > 2 and len(after) == 2 and after[0] == before[0] and x.factor == 1:
            return self.set(out, Map(x.segs, x.factor * math.prod(before[2:])))
        self.opaque(op, f"a reshape from {before} to {after} that moves the channels (a channel shuffle?)",
                    [x], out)

    def reduce(self, op: str, out, inputs) -> None:
        x_t, x = inputs[0]
        values = out[0] if isinstance(out, tuple) and out else out
        if not isinstance(values, torch.Tensor):
            return
        before, after = tuple(x_t.shape), tuple(values.shape)
        if len(after) >= 2 and after[:2] == before[:2] and x.factor == 1:
            gated = None if op in ("mean", "sum", "amax", "amin", "max", "min", "norm", "std") else False
            return self.set(values, x.with_gate(gated))
        if len(after) >= 1 and after[0] == before[0] and (len(after) == 1 or after[1] != before[1]) \
                or values.dim() == 0:  # over the channels: the values of every channel count
            for _, m in inputs:  # a sum over zeroed channels is the same; a mean or max is not
                if op != "sum" or any(not s.gated for s in m.segs):
                    self.g.pin(m, f"{self.where()}: {op} over the channels")
            return self.set(values, None)
        self.opaque(op, f"a reduction from {before} to {after}", [x], out)

    def op_cat(self, op, args, kwargs, out, inputs) -> None:
        tensors = _arg(args, kwargs, 0, "tensors")
        dim = _arg(args, kwargs, 1, "dim", 0)
        maps = [self.get(t) for t in tensors]
        if dim % out.dim() == 1 and all(m is not None and m.factor == 1 for m in maps):
            return self.set(out, Map([s for m in maps for s in m.segs]))
        if dim % out.dim() != 1 and all(m is not None for m in maps) and out.dim() >= 2:
            result = maps[0]  # along another dim: the operands' channels are the same channels
            for m in maps[1:]:
                result = self.g.tie(result, m, f"{self.where()}: cat of channels it cannot pair")
            return self.set(out, result)
        self.opaque(op, f"a concatenation along dim {dim} of tensors it cannot pair",
                    [m for _, m in inputs], out)

    def split(self, op: str, args, kwargs, out, inputs) -> None:
        """split / chunk / tensor_split / unbind: along the channels each piece gets its run of
        the map. ``chunk`` divides what it is given, so the pruned tensor's chunks are the pruned
        pieces when each keeps the same count; fixed sizes or bounds (``split(64)``) would not
        move with the cut: those channels are pinned."""
        x_t, x = inputs[0]
        dim = _arg(args, kwargs, 2 if op != "unbind" else 1, "dim", 0 if op != "hsplit" else 1)
        pieces = list(out) if isinstance(out, (list, tuple)) else [out]
        if dim % x_t.dim() != 1:
            for p in pieces:
                self.set(p, x if p.dim() == x_t.dim() else None)
            if any(p.dim() != x_t.dim() for p in pieces) and dim % x_t.dim() == 0:
                self.opaque(op, "a split that removes the batch dimension", [x], out)
            return
        if x.factor != 1:
            return self.opaque(op, "a split of flattened channels", [x], out)
        if op == "unbind":
            self.g.pin(x, f"{self.where()}: unbind over the channels")
            for p in pieces:
                self.set(p, None)
            return
        sizes = [p.shape[1] for p in pieces]
        count = _arg(args, kwargs, 1, "chunks" if op == "chunk" else "sections")
        by_count = op == "chunk" or (op == "tensor_split" and isinstance(count, int))
        if by_count and len(set(sizes)) == 1 and len(pieces) > 1:
            maps = self.g.refine(x, len(pieces))
            if maps is None:
                self.g.equal_blocks(x, len(pieces), "chunk")
                maps = [x.slice(i * sizes[0], (i + 1) * sizes[0]) for i in range(len(pieces))]
        else:
            if len(pieces) > 1:
                self.g.pin(x, f"{self.where()}: {op} into fixed sizes {sizes}")
            bounds = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
            maps = [x.slice(a, b) for a, b in zip(bounds, bounds[1:])]
        for p, m in zip(pieces, maps):
            self.set(p, m)

    def channel_index(self, idx, x_t: torch.Tensor, x: Map):
        """For ``x[idx]``: the channel positions it reads (None: all, in order), or a string
        saying why it cannot be followed."""
        idx = idx if isinstance(idx, tuple) else (idx,)
        if any(i is Ellipsis for i in idx):
            k = idx.index(Ellipsis)
            idx = idx[:k] + (slice(None),) * (x_t.dim() - len(idx) + 1) + idx[k + 1:]
        if any(i is None for i in idx):
            return "indexing that adds a dimension"
        if idx and not isinstance(idx[0], slice):
            return "indexing over the batch"
        if any(not isinstance(i, (slice, int)) for i in idx[2:]):
            return "advanced indexing of the spatial dimensions"
        if len(idx) < 2:
            return None
        c, i = x_t.shape[1], idx[1]
        if isinstance(i, slice):
            return None if i == slice(None) else list(range(c))[i]
        if isinstance(i, torch.Tensor) and i.dtype == torch.bool:  # as long as the channels were
            return i.nonzero().flatten().tolist() if len(i) == c else "a mask of another length"
        if isinstance(i, torch.Tensor):
            i = i.tolist()
        if isinstance(i, int):
            return "indexing one channel"
        if isinstance(i, (list, tuple)) and all(isinstance(v, int) for v in i):
            return [v % c for v in i]
        return "an index it does not know"

    @staticmethod
    def from_end(idx) -> bool:
        """Whether the channel index counts from the end (``x[:, -4:]``) or is a mask: then it
        names other channels once the tensor is narrower, and every channel is kept."""
        i = idx[1] if isinstance(idx, tuple) and len(idx) > 1 else None
        if isinstance(i, slice):
            return any(v is not None and v < 0 for v in (i.start, i.stop))
        if isinstance(i, torch.Tensor):
            return i.dtype == torch.bool or bool((i < 0).any())
        return isinstance(i, (list, tuple)) and any(isinstance(v, int) and v < 0 for v in i)

    def op_getitem(self, op, args, kwargs, out, inputs) -> None:
        x_t, idx = args[0], args[1]
        x = self.get(x_t)
        if x is None:  # the index is the tracked tensor (x[mask]): its values are read
            return self.opaque(op, "indexing by a tensor of channels", [m for _, m in inputs], out)
        positions = self.channel_index(idx, x_t, x)
        if isinstance(positions, str) or (positions is not None and x.factor != 1):
            why = positions if isinstance(positions, str) else "a slice of flattened channels"
            return self.opaque(op, why, [x], out)
        if positions is None:
            return self.set(out, x)
        self.pin_for_index(x, positions, x_t.shape[1], op, self.from_end(idx))
        self.set(out, x.take(positions))

    def pin_for_index(self, x: Map, positions: list[int], c: int, op: str,
                      whole: bool = False) -> None:
        """Fixed indices must mean the same channels after the cut: every position before the
        last one read is kept; a slice that runs to the end moves with the cut (its start
        must not); ``whole``: an index from the end, or a mask, keeps every channel."""
        if not positions:
            return
        run = positions == list(range(positions[0], positions[-1] + 1))
        stop = positions[0] if run and positions[-1] == c - 1 else max(positions) + 1
        stop = c if whole else stop
        if stop:
            self.g.pin(x.slice(0, stop), f"{self.where()}: {op} of channels by fixed bounds")

    def op_setitem(self, op, args, kwargs, out, inputs) -> None:
        x_t, idx, value = args[0], args[1], args[2]
        x = self.get(x_t)
        if x is None:
            return self.opaque(op, "writing tracked channels into an untracked tensor",
                               [m for _, m in inputs], None)
        positions = self.channel_index(idx, x_t, x)
        if isinstance(positions, str) or x.factor != 1:
            return self.opaque(op, positions if isinstance(positions, str) else "flattened channels",
                               [m for _, m in inputs], None)
        positions = list(range(x_t.shape[1])) if positions is None else positions
        self.pin_for_index(x, positions, x_t.shape[1], op, self.from_end(idx))
        v = self.get(value)
        if v is None or v.channels != len(positions):
            v = Map([Seg(self.g.new_space(len(positions), f"{self.where()}: written by {op}"), 0,
                         len(positions), False)])
        parts = {p: v.slice(i, i + 1).segs[0] for i, p in enumerate(positions)}
        segs = [parts.get(p) or x.slice(p, p + 1).segs[0] for p in range(x_t.shape[1])]
        merged = Map([])
        for s in segs:
            merged = Map(merged.segs + [s]) if not merged.segs or not _joins(merged.segs[-1], s) \
                else Map(merged.segs[:-1] + [Seg(s.space, merged.segs[-1].start,
                                                 merged.segs[-1].length + 1, s.gated)])
        self.set(x_t, merged)

    def op_zeros_like(self, op, args, kwargs, out, inputs) -> None:
        self.set(out, inputs[0][1].with_gate(True))

    def op_ones_like(self, op, args, kwargs, out, inputs) -> None:
        self.set(out, inputs[0][1].with_gate(False))

    op_empty_like = op_full_like = op_rand_like = op_randn_like = op_ones_like


def _keeps_channels(op: str, args, kwargs, n: int) -> bool:
    """Whether a permutation leaves dims 0 and 1 where they are."""
    if op == "permute":
        dims = args[1] if len(args) == 2 and isinstance(args[1], (list, tuple)) else args[1:]
        dims = kwargs.get("dims", dims)
        return len(dims) >= 2 and dims[0] % n == 0 and dims[1] % n == 1
    if op in ("transpose", "swapaxes"):
        a, b = _arg(args, kwargs, 1, "dim0"), _arg(args, kwargs, 2, "dim1")
        return isinstance(a, int) and isinstance(b, int) and not {a % n, b % n} & {0, 1}
    return False


def _joins(a: Seg, b: Seg) -> bool:
    return a.space == b.space and a.start + a.length == b.start and a.gated == b.gated
