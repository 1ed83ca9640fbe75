"""The channel graph of any traceable CNN: which channels are tied together, and who makes,
normalises and reads them. This answers "which channels go together" for ``slimming.prune`` on
networks that have no hand-written surgery (torchvision, timm, your own).

Why torch.fx rather than the autograd graph: fx names every module and function call (so an
unsupported pattern is one error naming the module and the op), sees the model before any
weight is touched, and traces every torchvision and timm CNN we support; a forward with
data-dependent Python control flow cannot be traced, which is one clear error too.

The model: every tensor with a channel dimension (N, C, H, W), or its flattened (N, C*k)
form, carries a *map*: a list of segments, each a run of channels of one *space*. A space is a
set of channels made by one producer (a convolution's or linear layer's outputs, the input
image). Element-wise ops, pooling and activations pass the map on; a depthwise convolution
passes it on (and is cut with it); a concatenation joins maps; a residual addition, or an
element-wise product such as squeeze-and-excitation's, *ties* the spaces of its operands
(union-find): their channels must be cut together. A set of tied spaces is a ``Group``; every
BatchNorm reading one of its channels scores that channel.

A group may lose channels only if the pruned network equals the original with those
channels' gamma and beta zeroed in every BatchNorm of the group. So a group is locked (kept
whole) when: it holds the input or the model's output, a producer or reader cannot be cut
(a grouped convolution, a module in ``ignore``), no BatchNorm scores it, or something other
than a BatchNorm reads its raw values (before any BatchNorm of the group has zeroed them:
removing such a channel would change what that reader sees).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import fx, nn

from ..errors import SlimmingError, clip, first_line


class GraphError(SlimmingError):
    """A network whose channels the graph cannot follow; names the module and the op."""


@dataclass
class Seg:
    """``length`` channels of space ``space`` from ``start``; ``gated``: zero once the group's
    BatchNorms are zeroed (the output of one, or of zero-preserving ops on one)."""

    space: int
    start: int
    length: int
    gated: bool


@dataclass
class Map:
    segs: list[Seg]
    factor: int = 1  # features per channel once flattened: (N, C, H, W) -> (N, C*H*W)

    @property
    def channels(self) -> int:
        return sum(s.length for s in self.segs)

    def with_gate(self, gated: bool | None) -> Map:
        """The same channels; ``gated`` None keeps each segment's own flag."""
        return Map([Seg(s.space, s.start, s.length, s.gated if gated is None else gated)
                    for s in self.segs], self.factor)


@dataclass
class Use:
    """A module that must be cut with the channels of ``map``: ``kind`` says how (``conv_in``,
    ``conv_out``, ``depthwise``, ``bn``, ``linear_in``, ``linear_out``)."""

    module: str
    kind: str
    map: Map


@dataclass
class Group:
    """Tied spaces of ``size`` channels each. ``bns``: (BatchNorm name, first position in that
    BN, first channel of the group, count): the scores. ``prunable`` False: ``reason`` why."""

    size: int
    spaces: list[int]
    bns: list[tuple[str, int, int, int]] = field(default_factory=list)
    prunable: bool = True
    reason: str = ""


# Element-wise or per-channel ops that map zero to zero (a zeroed channel stays zero) ...
ZERO_MODULES = (nn.ReLU, nn.ReLU6, nn.SiLU, nn.GELU, nn.Hardswish, nn.LeakyReLU, nn.ELU, nn.Mish,
                nn.Tanh, nn.Identity, nn.Dropout, nn.Dropout2d, nn.AlphaDropout, nn.MaxPool2d,
                nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d, nn.Upsample,
                nn.ZeroPad2d)
ZERO_FUNCTIONS = {"relu", "relu_", "relu6", "silu", "gelu", "hardswish", "leaky_relu", "elu", "mish",
                  "tanh", "dropout", "dropout2d", "adaptive_avg_pool2d", "adaptive_max_pool2d",
                  "avg_pool2d", "max_pool2d", "interpolate", "upsample", "pad", "stochastic_depth",
                  "contiguous", "clone", "float", "to", "type", "detach", "identity", "drop_path",
                  "truediv", "neg"}
# ... and those that do not (sigmoid(0) = 0.5): the channel passes, not its zero
PASS_MODULES = (nn.Sigmoid, nn.Hardsigmoid, nn.Softplus)
PASS_FUNCTIONS = {"sigmoid", "hardsigmoid", "softplus", "exp"}
NOT_TENSORS = {"size", "dim", "getattr", "numel", "len", "eq", "ne", "assert", "is_floating_point"}
# torchvision's StochasticDepth (EfficientNet): identity in eval, a per-sample mask in training;
# matched by name, so that pruning a VGG does not import torchvision (seconds)
ZERO_BY_NAME = {("torchvision.ops.stochastic_depth", "StochasticDepth")}


def _zero_preserving(m: nn.Module) -> bool:
    return isinstance(m, ZERO_MODULES) or (type(m).__module__, type(m).__name__) in ZERO_BY_NAME


class Tracer(fx.Tracer):
    """torch.fx's tracer, stopping at every convolution, linear and BatchNorm module (timm's
    BatchNormAct2d included), whatever library it comes from."""

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        if isinstance(m, (nn.Conv2d, nn.Linear, nn.modules.batchnorm._BatchNorm)):
            return True
        return super().is_leaf_module(m, qualname)


def _op_name(node: fx.Node) -> str:
    if node.op == "call_method":
        return node.target
    return getattr(node.target, "__name__", str(node.target)).lstrip("_")


def _where(node: fx.Node) -> str:
    """The innermost module a node was traced in, for messages."""
    if node.op == "call_module":
        return node.target
    stack = node.meta.get("nn_module_stack") or {}
    return next(reversed(stack.values()))[0] if stack else "the model's forward"


def _shape(node) -> tuple[int, ...] | None:
    return node.meta.get("shape") if isinstance(node, fx.Node) else None


class ChannelGraph:
    """Built by ``trace``: spaces (union-find), uses, locks, and the groups they make."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.parent: list[int] = []
        self.sizes: list[int] = []
        self.uses: list[Use] = []
        self.locks: dict[int, str] = {}  # space -> why its group cannot be cut
        self.bn_order = {name: i for i, (name, m) in enumerate(model.named_modules())
                         if isinstance(m, nn.modules.batchnorm._BatchNorm)}

    # union-find over spaces
    def new_space(self, size: int, lock: str = "") -> int:
        self.parent.append(len(self.parent))
        self.sizes.append(size)
        if lock:
            self.locks[len(self.parent) - 1] = lock
        return len(self.parent) - 1

    def find(self, s: int) -> int:
        while self.parent[s] != s:
            self.parent[s] = self.parent[self.parent[s]]
            s = self.parent[s]
        return s

    def lock(self, m: Map, why: str) -> None:
        for seg in m.segs:
            self.locks.setdefault(seg.space, why)

    def tie(self, a: Map, b: Map, node: fx.Node, product: bool = False) -> Map:
        """Channels of ``a`` and ``b`` are the same channels (a residual sum, an SE product).
        The result is zero where both are (a sum) or either is (a product)."""
        la, lb = [s.length for s in a.segs], [s.length for s in b.segs]
        if la != lb or a.factor != b.factor:
            raise GraphError(f"{_where(node)}: {_op_name(node)} of tensors whose channels come from "
                             "different concatenations; slimming cannot tie them channel by channel")
        out = []
        for sa, sb in zip(a.segs, b.segs):
            ra, rb = self.find(sa.space), self.find(sb.space)
            if ra != rb:
                whole = (sa.start == sb.start == 0 and sa.length == self.sizes[ra] == self.sizes[rb])
                if not whole:
                    raise GraphError(f"{_where(node)}: {_op_name(node)} of slices of channels; "
                                     "slimming ties only whole channel sets")
                self.parent[rb] = ra
            elif sa.start != sb.start:
                raise GraphError(f"{_where(node)}: {_op_name(node)} of shifted channels of one set")
            gated = (sa.gated or sb.gated) if product else (sa.gated and sb.gated)
            out.append(Seg(sa.space, sa.start, sa.length, gated))
        return Map(out, a.factor)

    def groups(self) -> list[Group]:
        """The groups, ordered by their first BatchNorm in ``modules()`` order (so that ties in
        a global ranking break as the hand-written path breaks them)."""
        by_root: dict[int, Group] = {}
        for s in range(len(self.parent)):
            r = self.find(s)
            g = by_root.setdefault(r, Group(self.sizes[r], []))
            g.spaces.append(s)
            if s in self.locks and g.prunable:
                g.prunable, g.reason = False, self.locks[s]
        for use in self.uses:
            if use.kind == "bn":
                pos = 0
                for seg in use.map.segs:
                    by_root[self.find(seg.space)].bns.append((use.module, pos, seg.start, seg.length))
                    pos += seg.length
            elif use.kind in ("conv_in", "linear_in"):  # a reader must see zeros where we cut
                for seg in use.map.segs:
                    g = by_root[self.find(seg.space)]
                    if not seg.gated and g.prunable:
                        g.prunable, g.reason = False, f"{use.module} reads it before any BatchNorm"
        for g in by_root.values():
            affine = [b for b in g.bns if getattr(self.model.get_submodule(b[0]), "weight", None)
                      is not None]
            if g.prunable and not affine:
                g.prunable, g.reason = False, "no BatchNorm scores it"
        groups = list(by_root.values())
        groups.sort(key=lambda g: min((self.bn_order.get(b[0], 1 << 30) for b in g.bns),
                                      default=1 << 30))
        return groups


def ignored_names(model: nn.Module, ignore) -> set[str]:
    """The qualified names of the modules ``ignore`` keeps whole: each entry a module's name or a
    module type (``nn.Linear``, a detection head's class), and everything inside what it names
    (``"head"`` keeps ``head.cv1`` too). SlimmingError for a name no module has (a typo would
    keep nothing) or an entry that is neither."""
    entries = (ignore,) if isinstance(ignore, (str, type)) else tuple(ignore)
    names = dict(model.named_modules())
    roots: set[str] = set()
    for entry in entries:
        if isinstance(entry, type) and issubclass(entry, nn.Module):
            roots |= {n for n, m in names.items() if isinstance(m, entry)}
        elif isinstance(entry, str):
            if entry not in names:
                raise SlimmingError(f"ignore names {clip(entry)}, which is no module of "
                                    f"{type(model).__name__}", param="ignore")
            roots.add(entry)
        else:
            raise SlimmingError(f"ignore takes module names and module types, not {clip(entry)}",
                                param="ignore")
    return {n for n in names for r in roots if n == r or not r or n.startswith(r + ".")}


def trace(model: nn.Module, example_inputs: torch.Tensor, ignore=()) -> ChannelGraph:
    """Trace ``model`` (left unchanged) on ``example_inputs`` (N, C, H, W) and build its channel
    graph. ``ignore``: modules whose channels must all be kept, by name (a name keeps what is
    inside it too) or by type (``ignored_names``). Raises GraphError (one line, naming the module
    and the op) for what it cannot follow."""
    keep = ignored_names(model, ignore)
    was_training, before = model.training, set(vars(model))
    model.eval()  # a traced forward with BN statistics frozen; batch 1 is fine
    try:
        try:
            graph = Tracer().trace(model)
        except Exception as e:  # fx raises many kinds for untraceable Python: all mean the same
            raise GraphError(f"torch.fx cannot trace {type(model).__name__}'s forward "
                             f"({first_line(e, 160)}); slimming prunes traceable models") from None
        try:
            with torch.no_grad():  # real tensors: at these sizes, faster than meta ones (measured)
                _propagate(model, graph, example_inputs)
        except Exception as e:
            raise GraphError(f"{type(model).__name__} does not run on example_inputs of shape "
                             f"{tuple(example_inputs.shape)}: {first_line(e, 160)}") from None
    finally:
        model.train(was_training)
        for name in set(vars(model)) - before:  # constants fx parked on the model while tracing
            delattr(model, name)
    return _Walk(model, graph, keep).run()


def structure_copy(module: nn.Module, memo: dict | None = None) -> nn.Module:
    """A copy of ``module``'s tree of modules (each module shallow-copied, its containers
    copied, a module shared in the tree copied once) still pointing at the same parameters and
    buffers. A fraction of ``copy.deepcopy``'s cost, which would copy every tensor."""
    memo = {} if memo is None else memo
    if id(module) in memo:
        return memo[id(module)]
    new = module.__class__.__new__(module.__class__)
    new.__dict__ = {k: v.copy() if isinstance(v, (dict, list, set)) else v
                    for k, v in module.__dict__.items()}
    memo[id(module)] = new
    for key, child in module._modules.items():
        new._modules[key] = None if child is None else structure_copy(child, memo)
    return new


def _attribute(model: nn.Module, target: str):
    value = model
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _shape_only(m: nn.Module, args, kwargs) -> torch.Tensor | None:
    """For the plain convolution, BatchNorm and linear layers, a tensor of the right shape
    without their arithmetic (no later shape depends on values); None: run the module."""
    x = args[0] if len(args) == 1 and not kwargs else None
    if not isinstance(x, torch.Tensor):
        return None
    kind = type(m)
    if kind is nn.Conv2d and m.padding_mode == "zeros" and isinstance(m.padding, tuple) \
            and x.dim() == 4 and x.shape[1] == m.in_channels:
        size = [(n + 2 * p - d * (k - 1) - 1) // s + 1 for n, p, d, k, s in
                zip(x.shape[2:], m.padding, m.dilation, m.kernel_size, m.stride)]
        return x.new_zeros(x.shape[0], m.out_channels, *size) if min(size) > 0 else None
    if kind is nn.BatchNorm2d and x.dim() == 4 and x.shape[1] == m.num_features:
        return x
    if kind is nn.Linear and x.dim() >= 1 and x.shape[-1] == m.in_features:
        return x.new_zeros(*x.shape[:-1], m.out_features)
    return None


def _propagate(model: nn.Module, graph: fx.Graph, x: torch.Tensor) -> None:
    """Run the traced graph once on ``x`` with the model's own modules, recording each node's
    output shape (None for what is not one tensor) in ``node.meta["shape"]``: what fx's
    ShapeProp does, without building and compiling a GraphModule first, and without the
    arithmetic of plain convolutions (``_shape_only``): a few milliseconds, not a forward."""
    env: dict[fx.Node, object] = {}

    def load(a):
        return fx.node.map_arg(a, lambda n: env[n])

    for node in graph.nodes:
        if node.op == "placeholder":
            value = x
        elif node.op == "get_attr":
            value = _attribute(model, node.target)
        elif node.op == "call_module":
            m, args = model.get_submodule(node.target), load(node.args)
            value = _shape_only(m, args, node.kwargs)
            if value is None:
                value = m(*args, **load(node.kwargs))
        elif node.op == "call_function":
            value = node.target(*load(node.args), **load(node.kwargs))
        elif node.op == "call_method":
            obj, *rest = load(node.args)
            value = getattr(obj, node.target)(*rest, **load(node.kwargs))
        else:
            value = None
        env[node] = value
        node.meta["shape"] = tuple(value.shape) if isinstance(value, torch.Tensor) else None


class _Walk:
    """One pass over the traced graph, giving every tensor node its channel map."""

    def __init__(self, model: nn.Module, graph: fx.Graph, ignore: set[str]):
        self.model, self.graph, self.ignore = model, graph, ignore
        self.g = ChannelGraph(model)
        self.env: dict[fx.Node, Map | None] = {}

    def run(self) -> ChannelGraph:
        for node in self.graph.nodes:
            self.env[node] = self.visit(node)
        return self.g

    def maps(self, node: fx.Node) -> list[tuple[fx.Node, Map]]:
        """The mapped tensors among a node's arguments (lists flattened)."""
        found = []
        for arg in [*node.args, *node.kwargs.values()]:
            for a in (arg if isinstance(arg, (list, tuple)) else [arg]):
                if isinstance(a, fx.Node) and self.env.get(a) is not None:
                    found.append((a, self.env[a]))
        return found

    def fail(self, node: fx.Node, what: str) -> GraphError:
        return GraphError(f"{_where(node)}: slimming cannot follow the channels through "
                          f"{_op_name(node)} ({what}); list the module in ignore= or simplify it")

    def visit(self, node: fx.Node) -> Map | None:
        shape = _shape(node)
        if node.op == "placeholder":
            if shape is None or len(shape) != 4:
                raise GraphError(f"the model's input is {shape}, not an image batch (N, C, H, W)")
            return Map([Seg(self.g.new_space(shape[1], "the input image"), 0, shape[1], False)])
        if node.op == "output":
            for _, m in self.maps(node):
                self.g.lock(m, "the model's output")
            return None
        if node.op == "get_attr":
            return None  # a parameter used directly: no channels of its own
        if shape is None:  # sizes, flags, tuples
            if self.maps(node) and _op_name(node) not in NOT_TENSORS:
                raise self.fail(node, "a result that is not one tensor")
            return None
        if node.op == "call_module":
            return self.module(node, self.model.get_submodule(node.target), shape)
        return self.function(node, shape)

    # --------------------------------------------------------------------------- modules

    def module(self, node: fx.Node, m: nn.Module, shape) -> Map | None:
        args = self.maps(node)
        name = node.target
        x = args[0][1] if args else None
        if isinstance(m, nn.Conv2d):
            if x is None:
                raise self.fail(node, "a convolution of an input slimming does not track")
            if x.factor != 1:
                raise self.fail(node, "a convolution of a flattened tensor")
            if name in self.ignore:
                self.g.lock(x, f"{name} is in ignore")
            if m.groups == 1:
                self.g.uses.append(Use(name, "conv_in", x))
                out = self.g.new_space(m.out_channels, f"{name} is in ignore" if name in self.ignore else "")
                self.g.uses.append(Use(name, "conv_out", Map([Seg(out, 0, m.out_channels, False)])))
                return Map([Seg(out, 0, m.out_channels, False)])
            if m.groups == m.in_channels == m.out_channels:  # depthwise: channel c -> channel c
                self.g.uses.append(Use(name, "depthwise", x))
                return x.with_gate(None if m.bias is None else False)
            self.g.lock(x, f"the grouped convolution {name} (groups={m.groups})")
            out = self.g.new_space(m.out_channels, f"the grouped convolution {name} (groups={m.groups})")
            return Map([Seg(out, 0, m.out_channels, False)])
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            if x is None or x.factor != 1 or len(shape) != 4:
                raise self.fail(node, "a BatchNorm of something other than (N, C, H, W) channels")
            if name in self.ignore:
                self.g.lock(x, f"{name} is in ignore")
            self.g.uses.append(Use(name, "bn", x))
            act = getattr(m, "act", None)  # timm's BatchNormAct2d: BN, then its activation
            zero = m.weight is not None and (act is None or _zero_preserving(act))
            return x.with_gate(True if zero else False)
        if isinstance(m, nn.Linear):
            if x is None:
                raise self.fail(node, "a linear layer of an input slimming does not track")
            if len(shape) != 2:
                raise self.fail(node, "a linear layer on more than (N, features)")
            if name in self.ignore:
                self.g.lock(x, f"{name} is in ignore")
            self.g.uses.append(Use(name, "linear_in", x))
            out = self.g.new_space(m.out_features, f"{name} is in ignore" if name in self.ignore else "")
            self.g.uses.append(Use(name, "linear_out", Map([Seg(out, 0, m.out_features, False)])))
            return Map([Seg(out, 0, m.out_features, False)])
        if isinstance(m, nn.Flatten):
            return self.flatten(node, x, m.start_dim, m.end_dim, shape)
        if _zero_preserving(m) or isinstance(m, PASS_MODULES):
            if x is None:
                return None
            return x.with_gate(None if _zero_preserving(m) else False)
        if not args:
            return None
        raise self.fail(node, f"the module {type(m).__name__}")

    # --------------------------------------------------------------------------- functions

    def function(self, node: fx.Node, shape) -> Map | None:
        op = _op_name(node)
        args = self.maps(node)
        if not args:
            return None  # made from constants only
        if op in ("add", "iadd", "sub", "isub"):
            return self.combine(node, args, shape, product=False)
        if op in ("mul", "imul"):
            return self.combine(node, args, shape, product=True)
        if op in ("cat", "concat", "concatenate"):
            dim = node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else 0)
            if dim % len(shape) != 1 or any(m.factor != 1 for _, m in args):
                raise self.fail(node, f"a concatenation along dim {dim}, not the channels")
            return Map([seg for _, m in args for seg in m.segs])
        x = args[0][1]
        if op == "flatten":
            start = node.kwargs.get("start_dim", node.args[1] if len(node.args) > 1 else
                                    (1 if node.op == "call_method" else 0))
            end = node.kwargs.get("end_dim", node.args[2] if len(node.args) > 2 else -1)
            return self.flatten(node, x, start, end, shape)
        if op in ("view", "reshape"):
            before = _shape(args[0][0])
            if len(before) == 4 and len(shape) == 2 and shape[0] == before[0]:
                return Map(x.segs, x.factor * before[2] * before[3])
            if shape[:2] == before[:2]:
                return x
            raise self.fail(node, f"a reshape from {before} to {shape} that moves the channels "
                            "(a channel shuffle?)")
        if op in ("mean", "sum", "amax", "amin"):
            dims = node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else None)
            dims = dims if isinstance(dims, (list, tuple)) else [dims]
            before = _shape(args[0][0])
            if None in dims or any(d % len(before) in (0, 1) for d in dims):
                raise self.fail(node, "a reduction over the channels")
            return x
        if op in ZERO_FUNCTIONS:
            if len(args) > 1:
                raise self.fail(node, "an op of several tensors")
            return x.with_gate(None)
        if op in PASS_FUNCTIONS:
            return x.with_gate(False)
        raise self.fail(node, "an op it does not know")

    def flatten(self, node: fx.Node, x: Map | None, start: int, end: int, shape) -> Map | None:
        if x is None:
            return None
        before = _shape(node.args[0])
        if len(before) == 2 or (start % len(before) == 1 and end % len(before) == 1):
            return x
        if len(before) == 4 and start % 4 == 1 and end % 4 == 3:
            return Map(x.segs, x.factor * before[2] * before[3])
        if len(before) == 4 and start % 4 == 2:
            return x  # (N, C, H*W): the channels stay in dim 1
        raise self.fail(node, f"flatten({start}, {end}) of {before}")

    def combine(self, node: fx.Node, args, shape, product: bool) -> Map:
        """A sum or product of two operands: equal channel counts tie their spaces; a
        one-channel tensor or a number broadcasts (a product keeps zeros, a sum does not)."""
        full = [m for _, m in args if m.channels * m.factor == shape[1]]
        if not full:
            raise self.fail(node, "an op whose output channels no operand has")
        for a in node.args[:2]:
            other = _shape(a) if isinstance(a, fx.Node) and self.env.get(a) is None else None
            if other and len(other) > 1 and other[1] == shape[1] > 1:
                raise self.fail(node, "an op with a parameter or buffer over the channels")
        out = full[0]
        for m in full[1:]:
            out = self.g.tie(out, m, node, product)
        broadcast = len(full) < len(node.args[:2])
        return out.with_gate(False) if broadcast and not product else out
