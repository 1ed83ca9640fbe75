"""What torch functions do to channels: the tables the trace dispatches on (element-wise ops
that keep a zero, those that pass the channel but not its zero, sums, products, reshapes,
reductions, splits), the record of one call as a handler sees it (``Step``), and the handlers
of the ops that are neither layers nor reshapes nor indexing: element-wise ops pass a map on,
sums and products tie, concatenations join, reductions keep or make channels, splits take runs
of a map, products of matrices and attention contract. Each handler is a function of the walk
(``slimming.pruning.trace.Walk``: the maps, the graph, the module running) and the step.
Reshapes and heads are in ``slimming.pruning.reshape``, indexing in ``slimming.pruning.index``,
layers in ``slimming.pruning.layer_calls``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import torch
from torch import nn

from ..errors import SlimmingError, first_line
from .graph import ChannelGraph, Map
from .traced import Traced

# Element-wise or per-channel ops that map zero to zero (a zeroed channel stays zero) ...
ZERO_OPS = {"relu", "relu6", "silu", "gelu", "hardswish", "leaky_relu", "elu", "mish", "tanh",
            "dropout", "dropout2d", "feature_dropout", "adaptive_avg_pool2d", "adaptive_max_pool2d",
            "avg_pool2d", "max_pool2d", "interpolate", "upsample", "upsample_nearest2d",
            "upsample_bilinear2d", "pad", "contiguous", "clone", "float", "half", "bfloat16", "to",
            "type", "detach", "neg", "abs", "hardtanh", "sin", "tanhshrink", "softsign",
            "square", "sqrt", "pixel_unshuffle", "adaptive_avg_pool1d",
            "avg_pool1d", "max_pool1d", "alpha_dropout", "cpu", "cuda", "type_as", "data",
            "adaptive_avg_pool3d", "adaptive_max_pool3d", "avg_pool3d", "max_pool3d",
            "adaptive_max_pool1d", "dropout3d", "dropout1d", "upsample_nearest3d", "contiguous_format"}
# ... and those that pass the channel but not its zero (sigmoid(0) = 0.5)
PASS_OPS = {"sigmoid", "hardsigmoid", "softplus", "exp", "log_sigmoid", "selu", "celu", "add_scalar",
            "clamp", "clip", "clamp_min", "reciprocal", "log", "rsqrt", "pow"}
# ... of those, the ones that work on the dimensions after the channels (N, C, H, W): on a
# channels-last tensor they would mix what the trace takes for channels
SPATIAL_OPS = {op for op in ZERO_OPS if "pool" in op or "upsample" in op} | {
    "interpolate", "pad", "pixel_unshuffle", "dropout1d", "dropout2d", "dropout3d", "feature_dropout"}
# Results about a tensor, not its values
META_OPS = {"get", "size", "dim", "numel", "shape", "is_floating_point", "is_contiguous", "is_nested",
            "element_size", "stride", "data_ptr", "get_device", "is_complex", "storage_offset",
            "ndimension", "nelement",
            "has_names", "names", "dtype", "device", "is_cuda", "layout", "requires_grad_", "len",
            "format", "repr", "hash", "ndim", "grad_fn", "is_leaf", "grad", "is_sparse", "is_meta",
            "is_quantized", "itemsize", "nbytes", "requires_grad", "is_mkldnn", "output_nr"}
VALUE_OPS = {"item", "tolist", "bool", "float", "int"}  # a tensor's values, read by Python
CONSTANT_OPS = {"new_zeros", "new_ones", "new_full", "new_empty", "new_tensor"}  # shape only
SUM_OPS = {"add", "sub", "maximum", "minimum", "fmax", "fmin"}
PRODUCT_OPS = {"mul", "multiply"}
RESHAPE_OPS = {"view", "reshape", "flatten", "squeeze", "unsqueeze", "permute", "transpose",
               "view_as", "reshape_as", "expand", "expand_as", "movedim", "swapaxes", "mT", "T", "mH",
               "unflatten", "moveaxis", "swapdims"}
PERMUTE_OPS = {"permute", "transpose", "swapaxes", "swapdims", "movedim", "moveaxis", "mT", "T", "mH"}
# Element-wise ops whose arguments decide whether a zero stays zero (hardtanh(x, 0.1, 2.0) does
# not, clamp_min(x, 0) does): the trace runs them on a zero to know
ELEMENTWISE = {"hardtanh", "clamp", "clip", "clamp_min", "clamp_max", "threshold", "leaky_relu", "elu",
               "celu", "selu", "softplus", "relu6", "hardswish", "gelu", "silu", "mish", "tanh",
               "sigmoid", "hardsigmoid", "exp", "log_sigmoid", "reciprocal", "log", "rsqrt", "pow",
               "abs", "neg", "sqrt", "square", "sin", "tanhshrink", "softsign", "nan_to_num", "relu",
               "add_scalar", "erf", "cos", "sign", "round", "floor", "ceil", "trunc", "frac",
               "logit", "expm1", "log1p", "sinh", "asinh", "atan", "tan", "rrelu", "hardshrink",
               "softshrink", "fill"}
REDUCE_OPS = {"mean", "sum", "amax", "amin", "max", "min", "std", "var", "norm", "logsumexp", "prod"}
SPLIT_OPS = {"chunk", "split", "tensor_split", "unbind", "split_with_sizes", "hsplit"}
HEAD_ATTRS = ("num_heads", "heads", "n_heads", "n_head", "nhead", "num_attention_heads")  # a module's heads
NORM_OPS = {"layer_norm", "local_response_norm", "rms_norm"}  # over all the channels: kept


def op_name(func) -> str:
    """``Tensor.__radd__`` -> ``add``, ``relu_`` -> ``relu``, ``_max_pool2d`` -> ``max_pool2d``,
    a property (``Tensor.data.__get__``) -> its name (``data``)."""
    name = getattr(func, "__name__", str(func))
    if name == "__get__":
        name = getattr(getattr(func, "__self__", None), "__name__", name)
    name = name.strip("_")
    for prefix in ("r", "i"):
        if name.startswith(prefix) and name[1:] in SUM_OPS | PRODUCT_OPS | {"truediv", "div"}:
            return name[1:]
    return {"truediv": "div", "concat": "cat", "concatenate": "cat"}.get(name, name)


def arg(args, kwargs, i: int, key: str, default=None):
    """An op's argument ``key``, given by name or as the ``i``-th positional one."""
    if key in kwargs:
        return kwargs[key]
    return args[i] if len(args) > i else default


_AUGMENTED = {"add", "sub", "mul", "truediv", "floordiv", "pow", "and", "or", "xor", "mod"}


def in_place(func, args, kwargs, out) -> bool:
    """Whether ``func`` wrote into its first argument (``add_``, ``copy_``, ``__setitem__``,
    ``x += y``, ``F.relu(x, inplace=True)``)."""
    name = getattr(func, "__name__", "")
    first = args[0] if args else None
    return (name == "__setitem__" or (name.endswith("_") and not name.startswith("_"))
            or (name.startswith("__i") and name[3:-2] in _AUGMENTED)
            or (isinstance(first, torch.Tensor) and out is first) or bool(kwargs.get("inplace")))


def keeps_zero(func, args, kwargs, x: torch.Tensor) -> bool:
    """Whether the element-wise ``func`` with these arguments maps 0 to 0 (run on a zero)."""
    zero = torch.zeros(1, dtype=x.dtype, device=x.device)
    rest = [a if not isinstance(a, torch.Tensor) or a is not x else zero for a in args[1:]]
    kw = {k: v for k, v in kwargs.items() if k not in ("inplace", "out")}
    try:
        got = func(zero, *rest, **kw)
    except Exception:  # noqa: BLE001 (arguments it cannot repeat: zeros are not assumed kept)
        return False
    return isinstance(got, torch.Tensor) and not bool(got.any())


def leaves(value, depth: int = 0, seen: set | None = None) -> list[torch.Tensor]:
    """The tensors in a model's output, whatever holds them: lists, tuples, dicts, dataclasses
    and other objects' attributes (a detector's result object), each object looked into once."""
    if isinstance(value, torch.Tensor):
        return [value]
    seen = set() if seen is None else seen
    if depth > 8 or id(value) in seen or isinstance(value, (str, bytes, int, float, bool, type(None))):
        return []
    seen.add(id(value))
    if isinstance(value, (list, tuple, set, frozenset)):
        items = list(value)
    elif isinstance(value, dict):
        items = list(value.values())
    elif isinstance(value, torch.nn.Module) or not hasattr(value, "__dict__"):
        return []
    else:
        items = list(vars(value).values())
    return [t for v in items for t in leaves(v, depth + 1, seen)]


def picker(output_transform):
    """``output_transform`` as a function of the model's output (the output itself without
    one); what it raises is one line naming it."""
    if output_transform is None:
        return lambda out: out

    def pick(out):
        try:
            return output_transform(out)
        except Exception as e:  # noqa: BLE001 (the user's function: any failure is one line)
            raise SlimmingError(f"output_transform failed on the model's output: {first_line(e, 120)}",
                                param="output_transform") from None
    return pick


def tensors(value) -> list[torch.Tensor]:
    """The tensors in a (nested) list, tuple or dict."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors(v)]
    return []


class Padded(NamedTuple):
    """What ``F.pad`` made (``out``), of what (``of``), with which ``pad``, ``mode`` and ``value``."""

    out: torch.Tensor
    of: torch.Tensor
    pad: Any
    mode: str
    value: Any


class Step(NamedTuple):
    """One call of the forward as a handler sees it: the op's name (``relu`` for ``relu_``
    and ``F.relu`` alike), the function, its arguments and result, and ``inputs``: the tracked
    tensors among its arguments with their maps."""

    op: str
    func: Callable
    args: tuple
    kwargs: dict
    out: Any
    inputs: list[tuple[torch.Tensor, Map]]


class Walk(Protocol):
    """What a handler reads and writes (``slimming.pruning.trace.Walk`` is it): the graph, each
    tracked tensor's map, the modules running, and the layers met so far."""

    g: ChannelGraph  # the channel algebra (``traced.graph``)
    traced: Traced  # the graph and the records beside it: widths, baked weights, coverage
    params: Any  # ``flow.Params`` (which imports this module): where parameters and buffers went
    model: nn.Module
    modules: dict[str, nn.Module]
    stack: list[str]  # the modules running, outermost first ("" for the model)
    ignore: set[str]
    keep_whole: dict[str, str]  # module kept whole -> why, as messages say it
    follow_sizes: bool
    seen: set[str]  # the layers that ran
    whole_at_leave: dict[str, tuple]  # module -> (why, of which width) the channels it reads are kept
    made: dict[str, tuple[int | None, Map]]  # layer -> (its output space, its first input)
    calls: dict[str, str]  # op name -> the layer kind whose rule is called through it
    entry: dict[str, torch.Tensor | None]  # module -> the first tensor its forward was given
    baking: dict[str, torch.Tensor]  # layer convolving with a weight it computed -> that call's output
    read: dict[tuple[str, int], Map]  # (module, width) -> the last map whose shape the module read

    def get(self, t) -> Map | None:
        """``t``'s channel map (None: untracked)."""

    def set(self, t, m: Map | None) -> None:
        """``t`` gets map ``m`` (None: untracked)."""

    def fresh(self, t, why: str, dim: int = 1) -> None:
        """``t`` gets channels of its own, kept whole."""

    def opaque(self, op: str, what: str, inputs: list[Map], out, dim: int | None = None) -> None:
        """An op not followed: what it reads is kept, what it makes is new and kept."""

    def where(self) -> str:
        """The module running, for messages."""

    def running(self) -> str:
        """The name of the module running ("" for the model's own forward)."""

    def pin_tensor(self, t, why: str) -> None: ...

    def keep(self, op: str, what: str, inputs: list[Map]) -> str:
        """Every channel of ``inputs`` kept because ``op`` reads them as ``what`` (warned)."""

    def in_ignored(self) -> bool: ...

    def why_kept(self, name: str) -> str:
        """Why ``name``'s channels are kept where it is in ignore or a block kept whole."""

    def sized(self, sizes: list[int]) -> bool:
        """Whether sizes a module holds in attributes may be followed."""

    def again(self, name: str, x: Map) -> int | None:
        """A layer called again: its input tied to its first call's; its output space."""

    def channel_tensor(self, t, c: int, dim: int | None = None) -> tuple[str, str, int] | None: ...

    def scale(self, module: str, attr: str, dim: int, x: Map) -> None: ...


Handler = Callable[[Walk, Step], None]  # what an op does to the channels


def constant(w: Walk, s: Step) -> None:
    w.set(s.out, None)  # a new tensor of a shape only (new_zeros)


def extremum(w: Walk, s: Step) -> None:
    if len(s.args) > 1 and isinstance(s.args[1], torch.Tensor):
        return combine(w, s._replace(op="maximum"))  # element-wise, of two tensors
    reduce(w, s)


def prelu(w: Walk, s: Step) -> None:
    if arg(s.args, s.kwargs, 1, "weight").numel() != 1:
        return w.opaque(s.op, "a PReLU with a slope per channel", [m for _, m in s.inputs], s.out)
    w.set(s.out, s.inputs[0][1].with_gate(None))  # one slope for all channels: 0 -> 0


def multi_head_attention(w: Walk, s: Step) -> None:
    """torch's own ``nn.MultiheadAttention`` forward: one ``slimming.layers.attention`` does not
    decompose (keys and values other than the queries, added keys), so its channels are kept."""
    w.opaque(s.op, "torch's MultiheadAttention forward, with keys and values other than its queries "
             "or keys added", [m for _, m in s.inputs], s.out)


def value(w: Walk, s: Step) -> None:
    if tensors(s.out):  # x.float(): a conversion, element-wise
        return elementwise(w, s)
    for _, m in s.inputs:
        w.g.pin(m, f"{w.where()}: its values are read by {s.op}")


def norm(w: Walk, s: Step) -> None:
    """Kept, not followed: a norm over the channels without a scale of its own (an rms_norm
    outside an nn.RMSNorm, a local response norm) normalises each channel by statistics of all
    the others, so cutting one changes what the rest become (a LayerNorm with its weight, a
    GroupNorm, an nn.RMSNorm: layers, by their rules)."""
    op, func, args, kwargs, out, inputs = s
    x_t, x = inputs[0]
    same = isinstance(out, torch.Tensor) and out.shape == x_t.shape
    w.opaque(op, "a normalisation over the channels: cutting one changes the others",
             [m for _, m in inputs], out, x.dim if same else 1)


def elementwise(w: Walk, s: Step) -> None:
    op, func, args, kwargs, out, inputs = s
    if op in ("type_as", "to") and args:  # anchors.type_as(features): the other gives a dtype only
        inputs = [(t, m) for t, m in inputs if t is args[0]]
        if not inputs:
            return w.set(out, None) if isinstance(out, torch.Tensor) else None
        s = s._replace(inputs=inputs)
    x_t, x = inputs[0]
    d = x.dim
    same = isinstance(out, torch.Tensor) and out.dim() == x_t.dim() and out.shape[0] == x_t.shape[0] \
        and out.shape[d] == x_t.shape[d] \
        and (d == 1 or op not in SPATIAL_OPS or _pads_around(op, args, kwargs, x_t, d))
    if len(inputs) > 1 or not same:
        return w.opaque(op, "an op of several tensors" if len(inputs) > 1 else "a change of shape",
                        [m for _, m in inputs], out)
    if op in ELEMENTWISE:
        zero = keeps_zero(func, args, kwargs, x_t)
    else:
        padded = op == "pad" and arg(args, kwargs, 3, "value", 0) not in (0, None)
        zero = op in ZERO_OPS and not padded
    w.set(out, x.with_gate(None if zero else False))


def _pads_around(op: str, args, kwargs, x: torch.Tensor, d: int) -> bool:
    """Whether ``op`` is a ``pad`` that leaves dim ``d`` (channels-last channels) as it is:
    pads other dims only (a Swin window's spatial padding of (N, H, W, C))."""
    pad = arg(args, kwargs, 1, "pad")
    if op != "pad" or not isinstance(pad, (tuple, list)) or len(pad) % 2:
        return False
    padded = {x.dim() - 1 - i for i in range(len(pad) // 2) if pad[2 * i] or pad[2 * i + 1]}
    return d not in padded


def combine(w: Walk, s: Step) -> None:
    """A sum or product: operands of the output's channel count are tied; one channel or a
    number broadcasts (a product keeps zeros; a sum keeps them only where what it adds is
    zero)."""
    op, func, args, kwargs, out, inputs = s
    maps = [m for _, m in inputs]
    if not isinstance(out, torch.Tensor) or out.dim() < 2:
        return w.opaque(op, "a result without channels", maps, out)
    dims = {m.dim for m in maps}
    if len(dims) > 1:
        return w.opaque(op, "operands with their channels in different dimensions", maps, out)
    d = dims.pop()
    c = out.shape[d]
    full, broadcast, scales = [], False, []
    for a in args[:2]:
        m = w.get(a)
        if m is not None:
            if a.dim() != out.dim():
                return w.opaque(op, "operands of different ranks", maps, out)
            if m.channels * m.factor == c:
                full.append(m)
            else:  # one channel broadcast over many: it must keep its one channel
                w.g.pin(m, f"{w.where()}: broadcast over channels by {op}")
                broadcast = True
        elif isinstance(a, torch.Tensor):
            lead = a.dim() - out.dim() + d
            if lead >= 0 and a.shape[lead] == c > 1:
                scale = w.channel_tensor(a, c, lead)  # a layer scale: cut with its channels
                if scale is None:
                    return w.opaque(op, "an op with a tensor over the channels that is no "
                                       "module's per-channel parameter or buffer", maps, out)
                scales.append(scale)
            # adding a tensor of zeros keeps zeros (a learnable bias still at its init, as
            # HGNetV2's LearnableAffineBlock): decided by the values the model has now
            broadcast = broadcast or bool(a.detach().ne(0).any())
        elif isinstance(a, (int, float)):  # a number: 0 + x keeps x's zeros (an empty sum's start)
            broadcast = broadcast or (op in SUM_OPS and a != 0)
    if not full or (op == "div" and w.get(args[1]) is not None):
        return w.opaque(op, "an op whose channels it cannot pair", maps, out)
    result = full[0]
    for m in full[1:]:
        result = w.g.tie(result, m, f"{w.where()}: {op} of channels it cannot pair one by one",
                            product=op in PRODUCT_OPS)
    for module, attr, dim in scales:
        w.scale(module, attr, dim, result)
    gated = None if not broadcast or op in PRODUCT_OPS or op == "div" else False
    w.set(out, result.with_gate(gated))

def reduce(w: Walk, s: Step) -> None:
    """A reduction over other dims keeps the channels (pooling (N, C, H, W) to (N, C), or
    tokens (N, L, C) to (N, C)); one over the channels makes new ones from all of them."""
    op, func, args, kwargs, out, inputs = s
    x_t, x = inputs[0]
    values = out[0] if isinstance(out, tuple) and out else out
    if not isinstance(values, torch.Tensor):
        return
    before, after = tuple(x_t.shape), tuple(values.shape)
    n, d = len(before), x.dim
    dims = arg(args, kwargs, 2 if op == "norm" else 1, "dim")
    dims = [dims] if isinstance(dims, int) else list(dims) if isinstance(dims, (list, tuple)) \
        and all(isinstance(v, int) for v in dims) and dims else None
    if dims is None and values.dim() and before != after:  # the dims from the shapes
        dims = [i for i in range(n) if len(after) == n and after[i] != before[i]]
    over = dims is None or d in {v % n for v in dims}
    if not over and x.factor == 1:
        gone = 0 if len(after) == n else sum(v % n < d for v in dims)
        if after[d - gone] == before[d]:
            gated = None if op in ("mean", "sum", "amax", "amin", "max", "min", "norm", "std") else False
            return w.set(values, x.with_gate(gated).at(d - gone))
    if values.dim() == 0 or (after and after[0] == before[0]):  # over the channels: all count
        for _, m in inputs:  # a sum over zeroed channels is the same; a mean or max is not
            if op != "sum" or any(not s.gated for s in m.segs):
                w.g.pin(m, f"{w.where()}: {op} over the channels")
        return w.fresh(values, f"{w.where()}: made by {op} over the channels")
    w.opaque(op, f"a reduction from {before} to {after}", [x], out)

def roll(w: Walk, s: Step) -> None:
    """``roll`` along dims other than the channels' (a Swin window's cyclic shift of
    (N, H, W, C)) moves positions, not channels, and keeps zeros; along the channels, or
    over the flattened tensor (no ``dims``), it mixes them: kept."""
    op, func, args, kwargs, out, inputs = s
    x_t, x = inputs[0]
    dims = arg(args, kwargs, 2, "dims")
    dims = [dims] if isinstance(dims, int) else list(dims or ())
    if len(inputs) == 1 and dims and x.factor == 1 and all(k % x_t.dim() != x.dim for k in dims):
        return w.set(out, x)
    w.opaque(op, "a roll along the channels", [m for _, m in inputs], out)

def cat(w: Walk, s: Step) -> None:
    op, func, args, kwargs, out, inputs = s
    parts = arg(args, kwargs, 0, "tensors")
    dim = arg(args, kwargs, 1, "dim", 0)
    maps = [w.get(t) for t in parts]
    at = {m.dim for m in maps if m is not None}
    d = at.pop() if len(at) == 1 else -1
    if dim % out.dim() == d and all(m is not None and m.factor == 1 for m in maps):
        return w.set(out, Map([s for m in maps for s in m.segs], 1, d))
    if d >= 0 and dim % out.dim() != d and out.dim() >= 2:
        # along another dim: the operands' channels are the same channels; a module's
        # parameter among them (a class token before the patch tokens) is cut with them
        params = [w.channel_tensor(t, out.shape[d], d) if m is None and isinstance(t, torch.Tensor)
                  and t.dim() == out.dim() else None for t, m in zip(parts, maps)]
        if all(m is not None or p is not None for m, p in zip(maps, params)):
            tracked = [m for m in maps if m is not None]
            result = tracked[0]
            for m in tracked[1:]:
                result = w.g.tie(result, m, f"{w.where()}: cat of channels it cannot pair")
            for p in params:
                if p is not None:
                    w.scale(*p, result)
            moved = any(p is not None and bool(t.detach().ne(0).any()) for t, p in zip(parts, params))
            return w.set(out, result.with_gate(False) if moved else result)
    w.opaque(op, f"a concatenation along dim {dim} of tensors it cannot pair",
                [m for _, m in inputs], out)

def stack(w: Walk, s: Step) -> None:
    """``stack`` ties its operands, as a concatenation along another dim does (the paths of
    a selective kernel); their channel dim moves by one where the new dim comes before it."""
    op, func, args, kwargs, out, inputs = s
    parts = arg(args, kwargs, 0, "tensors")
    maps = [w.get(t) for t in parts]
    at = {m.dim for m in maps if m is not None}
    if len(at) == 1 and all(m is not None and m.factor == 1 for m in maps):
        d = at.pop()
        result = maps[0]
        for m in maps[1:]:
            result = w.g.tie(result, m, f"{w.where()}: stack of channels it cannot pair")
        return w.set(out, result.at(d + (arg(args, kwargs, 1, "dim", 0) % out.dim() <= d)))
    w.opaque(op, "a stack of tensors it cannot pair", [m for _, m in inputs], out)

def split(w: Walk, s: Step) -> None:
    """split / chunk / tensor_split / unbind: along the channels each piece gets its run of
    the map. ``chunk`` divides what it is given, so the pruned tensor's chunks are the pruned
    pieces when each keeps the same count; fixed sizes or bounds (``split(64)``) would not
    move with the cut: those channels are pinned."""
    op, func, args, kwargs, out, inputs = s
    x_t, x = inputs[0]
    dim = arg(args, kwargs, 2 if op != "unbind" else 1, "dim", 0 if op != "hsplit" else 1)
    pieces = list(out) if isinstance(out, (list, tuple)) else [out]
    if dim % x_t.dim() != x.dim:  # along another dim: each piece has the same channels
        gone = dim % x_t.dim() < x.dim
        for p in pieces:
            w.set(p, x if p.dim() == x_t.dim() else x.at(x.dim - gone) if x.factor == 1 else None)
        return
    if x.factor != 1:
        return w.opaque(op, "a split of flattened channels", [x], out)
    if op == "unbind":
        w.g.pin(x, f"{w.where()}: unbind over the channels")
        for p in pieces:
            w.fresh(p, f"{w.where()}: a piece of unbind over the channels")
        return
    sizes = [p.shape[x.dim] for p in pieces]
    count = arg(args, kwargs, 1, "chunks" if op == "chunk" else "sections")
    by_count = op == "chunk" or (op == "tensor_split" and isinstance(count, int))
    if by_count and len(set(sizes)) == 1 and len(pieces) > 1:
        maps = w.g.refine(x, len(pieces))
        if maps is None:
            w.g.equal_blocks(x, len(pieces), "chunk")
            maps = [x.slice(i * sizes[0], (i + 1) * sizes[0]) for i in range(len(pieces))]
    elif len(pieces) > 1 and w.sized(sizes) and (maps := w.g.split_all(x, sizes)) is not None:
        # sizes the module keeps in attributes (an attention's key_dim, head_dim): the cut
        # sets them (``surgery.update_widths``); pieces of one size keep equal counts
        w.traced.widths.sized.append(w.where())
        w.traced.widths.split_sizes += [(w.running(), n) for n in set(sizes)]
        for n in set(sizes):
            same = [m.segs for m, k in zip(maps, sizes) if k == n]
            if len(same) > 1:
                w.g.equal.append(("chunk", same))
    else:
        if len(pieces) > 1:
            w.g.pin(x, f"{w.where()}: {op} into fixed sizes {sizes}")
        bounds = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
        maps = [x.slice(a, b) for a, b in zip(bounds, bounds[1:])]
    for p, m in zip(pieces, maps):
        w.set(p, m)

def matmul(w: Walk, s: Step) -> None:
    """``a @ b`` (and ``bmm``, ``mm``): channels along ``a``'s rows or ``b``'s columns, or
    along a batch dimension of both (attention heads), are the output's, zero where theirs
    are; channels both operands contract (a query against a key) are tied, cut alike, and
    leave no channels in the output (it is the same once the cut ones are zero on either
    side). Channels contracted against an untracked tensor (a raw weight) are kept."""
    op, func, args, kwargs, out, inputs = s
    a, b = arg(args, kwargs, 0, "input"), arg(args, kwargs, 1, "other", arg(args, kwargs, 1, "mat2"))
    ma, mb = w.get(a), w.get(b)
    maps = [m for _, m in inputs]
    if not all(isinstance(t, torch.Tensor) for t in (out, a, b)) \
            or min(a.dim(), b.dim()) < 2 or any(m.factor != 1 for m in maps):
        return w.opaque(op, "a product of flattened or one-dimensional channels", maps, out)
    n = out.dim()
    role_a = None if ma is None else "k" if ma.dim == a.dim() - 1 else "m" if ma.dim == a.dim() - 2 \
        else ma.dim + n - a.dim()
    role_b = None if mb is None else "k" if mb.dim == b.dim() - 2 else "n" if mb.dim == b.dim() - 1 \
        else mb.dim + n - b.dim()
    if role_a == "k" and role_b == "k":
        tied = w.g.tie(ma, mb, f"{w.where()}: {op} contracts channels it cannot pair", product=True)
        if any(not seg.gated for seg in tied.segs):
            w.g.pin(tied, f"{w.where()}: {op} contracts channels neither side zeroes")
        return w.set(out, None)  # the same in the pruned network: no channels of its own
    if "k" in (role_a, role_b):
        return w.opaque(op, "a product that contracts channels with an untracked tensor", maps, out)
    if role_a is not None and role_b is not None:
        if isinstance(role_a, int) and role_a == role_b:  # the same batch dim of both (heads)
            tied = w.g.tie(ma, mb, f"{w.where()}: {op} of channels it cannot pair", product=True)
            return w.set(out, tied.at(role_a))
        return w.opaque(op, "a product of channels along two dimensions", maps, out)
    m, role = (ma, role_a) if ma is not None else (mb, role_b)
    w.set(out, m.at(n - 2 if role == "m" else n - 1 if role == "n" else role))


def scaled_dot_product_attention(w: Walk, s: Step) -> None:
    """``F.scaled_dot_product_attention(q, k, v)``: the queries' and keys' channels are
    contracted (tied, cut alike), the values' are the output's. Its default scale is
    1/sqrt(the width of q), which a cut would change: without ``scale=``, q and k are kept."""
    op, func, args, kwargs, out, inputs = s
    q, k, v = (arg(args, kwargs, i, key) for i, key in enumerate(("query", "key", "value")))
    mq, mk, mv = w.get(q), w.get(k), w.get(v)
    maps = [m for _, m in inputs]
    last = [m is None or (m.dim == t.dim() - 1 and m.factor == 1) for m, t in ((mq, q), (mk, k), (mv, v))]
    if not all(last) or not isinstance(out, torch.Tensor):
        return w.opaque(op, "attention over other than the last dimension's channels", maps, out)
    if mq is not None and mk is not None:
        tied = w.g.tie(mq, mk, f"{w.where()}: attention of queries and keys it cannot pair",
                          product=True)
        if any(not seg.gated for seg in tied.segs):
            w.g.pin(tied, f"{w.where()}: attention contracts channels neither side zeroes")
        if arg(args, kwargs, 6, "scale") is None:
            w.g.pin(tied, f"{w.where()}: {op} scales by the width of its queries (give scale=)")
    elif mq is not None or mk is not None:
        w.g.pin(mq or mk, f"{w.where()}: attention contracts channels with untracked ones")
    w.set(out, None if mv is None else mv.at(out.dim() - 1))

def softmax(w: Walk, s: Step) -> None:
    """A softmax over another dimension (the paths of a selective kernel, the keys of
    attention) is per channel, and 0 does not stay 0; over the channels it mixes them."""
    op, func, args, kwargs, out, inputs = s
    x_t, x = inputs[0]
    dim = arg(args, kwargs, 1, "dim")
    if len(inputs) > 1 or not isinstance(dim, int) or dim % x_t.dim() == x.dim or x.factor != 1:
        return w.opaque(op, "a softmax over the channels", [m for _, m in inputs], out)
    w.set(out, x.with_gate(False))


def zeros_like(w: Walk, s: Step) -> None:
    op, func, args, kwargs, out, inputs = s
    w.set(out, inputs[0][1].with_gate(True))

def ones_like(w: Walk, s: Step) -> None:
    op, func, args, kwargs, out, inputs = s
    w.set(out, inputs[0][1].with_gate(False))




def permutation(op: str, args, kwargs, n: int) -> list[int] | None:
    """For a permuting op on an ``n``-dim tensor: ``perm`` with output dim i = input dim
    perm[i]; None for arguments it does not know."""
    perm = list(range(n))
    if op == "permute":
        dims = args[1] if len(args) == 2 and isinstance(args[1], (list, tuple)) else args[1:]
        dims = list(kwargs.get("dims", dims))
        return [v % n for v in dims] if sorted(v % n for v in dims) == perm else None
    if op in ("transpose", "swapaxes", "swapdims", "mT", "mH", "T"):
        if op in ("mT", "mH") or (op == "T" and n == 2):
            a, b = n - 2, n - 1
        elif op == "T":
            return perm[::-1]
        else:
            a, b = arg(args, kwargs, 1, "dim0"), arg(args, kwargs, 2, "dim1")
        if not isinstance(a, int) or not isinstance(b, int):
            return None
        perm[a % n], perm[b % n] = perm[b % n], perm[a % n]
        return perm
    src, dst = arg(args, kwargs, 1, "source"), arg(args, kwargs, 2, "destination")
    src, dst = ([src] if isinstance(src, int) else list(src)), ([dst] if isinstance(dst, int) else list(dst))
    if len(src) != len(dst):
        return None
    out = [-1] * n
    for a, b in zip(src, dst):
        out[b % n] = a % n
    rest = iter(v for v in perm if v not in {a % n for a in src})
    return [v if v >= 0 else next(rest) for v in out]
