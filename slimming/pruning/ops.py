"""What torch functions do to channels: the tables the trace dispatches on (element-wise ops
that keep a zero, those that pass the channel but not its zero, sums, products, reshapes,
reductions, splits) and the rules for the ops that move channels (``ChannelOps``: sums and
products tie, concatenations join, reshapes and reductions keep or flatten, splits and indexing
take runs of a map, fixed bounds pin). ``slimming.pruning.trace`` runs the forward and the
layers; it calls these rules with the real arguments and tensors of each call.
"""

from __future__ import annotations

import math

import torch

from .graph import Map, Seg

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
# Results about a tensor, not its values
META_OPS = {"get", "size", "dim", "numel", "shape", "is_floating_point", "is_contiguous", "element_size",
            "stride", "data_ptr", "get_device", "is_complex", "storage_offset", "ndimension", "nelement",
            "has_names", "names", "dtype", "device", "is_cuda", "layout", "requires_grad_", "len",
            "format", "repr", "hash", "ndim", "grad_fn", "is_leaf", "grad", "is_sparse", "is_meta",
            "is_quantized", "itemsize", "nbytes", "requires_grad", "is_mkldnn", "output_nr"}
VALUE_OPS = {"item", "tolist", "bool", "float", "int"}  # a tensor's values, read by Python
CONSTANT_OPS = {"new_zeros", "new_ones", "new_full", "new_empty", "new_tensor"}  # shape only
SUM_OPS = {"add", "sub", "maximum", "minimum", "fmax", "fmin"}
PRODUCT_OPS = {"mul", "multiply"}
RESHAPE_OPS = {"view", "reshape", "flatten", "squeeze", "unsqueeze", "permute", "transpose",
               "view_as", "reshape_as", "expand", "expand_as", "movedim", "swapaxes", "mT", "T", "mH"}
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
NORM_OPS = {"group_norm", "layer_norm", "local_response_norm", "rms_norm"}  # over the channels: kept


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


def tensors(value) -> list[torch.Tensor]:
    """The tensors in a (nested) list, tuple or dict."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors(v)]
    return []


class ChannelOps:
    """The rules, as methods of the trace's walk: they read and write tensors' maps through
    ``self.get`` / ``self.set``, build the graph ``self.g``, name the module at ``self.where()``
    and hand what they cannot follow to ``self.opaque`` (which ``slimming.pruning.trace``'s walk
    provides). Each takes the op's name, its arguments, its result and its mapped inputs."""

    def combine(self, op: str, args, out, inputs) -> None:
        """A sum or product: operands of the output's channel count are tied; one channel or a
        number broadcasts (a product keeps zeros; a sum keeps them only where what it adds is
        zero)."""
        maps = [m for _, m in inputs]
        if not isinstance(out, torch.Tensor) or out.dim() < 2:
            return self.opaque(op, "a result without channels", maps, out)
        c = out.shape[1]
        full, broadcast, scales = [], False, []
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
                    scale = self.channel_tensor(a, c)  # a layer scale: cut with its channels
                    if scale is None:
                        return self.opaque(op, "an op with a tensor over the channels that is no "
                                           "module's per-channel parameter or buffer", maps, out)
                    scales.append(scale)
                # adding a tensor of zeros keeps zeros (a learnable bias still at its init, as
                # HGNetV2's LearnableAffineBlock): decided by the values the model has now
                broadcast = broadcast or bool(a.detach().ne(0).any())
            elif isinstance(a, (int, float)):  # a number: 0 + x keeps x's zeros (an empty sum's start)
                broadcast = broadcast or (op in SUM_OPS and a != 0)
        if not full or (op == "div" and self.get(args[1]) is not None):
            return self.opaque(op, "an op whose channels it cannot pair", maps, out)
        result = full[0]
        for m in full[1:]:
            result = self.g.tie(result, m, f"{self.where()}: {op} of channels it cannot pair one by one",
                                product=op in PRODUCT_OPS)
        for module, attr, dim in scales:
            self.scale(module, attr, dim, result)
        gated = None if not broadcast or op in PRODUCT_OPS or op == "div" else False
        self.set(out, result.with_gate(gated))

    def reshape(self, op: str, args, kwargs, out, inputs) -> None:
        """Shape changes that keep dims 0 and 1, or flatten (N, C, ...) to (N, C*k)."""
        x_t, x = inputs[0]
        before, after = tuple(x_t.shape), tuple(out.shape) if isinstance(out, torch.Tensor) else None
        if after is None or len(inputs) > 1:
            return self.opaque(op, "a reshape of several tensors", [x], out)
        moves = op in ("permute", "transpose", "swapaxes", "movedim", "mT")
        if moves and not keeps_channels(op, args, kwargs, len(before)):
            return self.opaque(op, "a permutation that moves the channels", [x], out)
        if len(before) >= 2 and len(after) >= 2 and before[:2] == after[:2] and \
                (x.factor == 1 or len(after) == 2):
            return self.set(out, x)
        if len(before) > 2 and len(after) == 2 and after[0] == before[0] and x.factor == 1:
            return self.set(out, Map(x.segs, x.factor * math.prod(before[2:])))
        # Kept, not followed: channels split into (groups, per-group channels). Attention's
        # (N, C, H, W) -> (N, heads, C / heads, H * W) needs a map over two channel dims, equal
        # counts in every head, and queries, keys and values cut apart where the module splits
        # them by sizes it keeps in attributes (key_dim, head_dim); a channel shuffle's view,
        # transpose, view needs a channel permutation. Neither fits a map over one channel dim.
        split = len(after) >= 3 and after[0] == before[0] and after[1] > 1 \
            and after[1] * after[2] == before[1]
        what = "a reshape that splits the channels into groups (attention heads, a channel shuffle)" \
            if split else "a reshape that moves the channels"
        self.opaque(op, f"{what}: {before} to {after}", [x], out)

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
            return self.fresh(values, f"{self.where()}: made by {op} over the channels")
        self.opaque(op, f"a reduction from {before} to {after}", [x], out)

    def op_cat(self, op, args, kwargs, out, inputs) -> None:
        parts = arg(args, kwargs, 0, "tensors")
        dim = arg(args, kwargs, 1, "dim", 0)
        maps = [self.get(t) for t in parts]
        if dim % out.dim() == 1 and all(m is not None and m.factor == 1 for m in maps):
            return self.set(out, Map([s for m in maps for s in m.segs]))
        if dim % out.dim() != 1 and all(m is not None for m in maps) and out.dim() >= 2:
            result = maps[0]  # along another dim: the operands' channels are the same channels
            for m in maps[1:]:
                result = self.g.tie(result, m, f"{self.where()}: cat of channels it cannot pair")
            return self.set(out, result)
        self.opaque(op, f"a concatenation along dim {dim} of tensors it cannot pair",
                    [m for _, m in inputs], out)

    def op_stack(self, op, args, kwargs, out, inputs) -> None:
        """``stack`` along a dim after the channels ties its operands (they stay at dim 1, as a
        concatenation along another dim does); before them, the channels move: kept."""
        parts = arg(args, kwargs, 0, "tensors")
        maps = [self.get(t) for t in parts]
        if arg(args, kwargs, 1, "dim", 0) % out.dim() >= 2 and all(m is not None and m.factor == 1
                                                                    for m in maps):
            result = maps[0]
            for m in maps[1:]:
                result = self.g.tie(result, m, f"{self.where()}: stack of channels it cannot pair")
            return self.set(out, result)
        self.opaque(op, "a stack that moves the channels", [m for _, m in inputs], out)

    def split(self, op: str, args, kwargs, out, inputs) -> None:
        """split / chunk / tensor_split / unbind: along the channels each piece gets its run of
        the map. ``chunk`` divides what it is given, so the pruned tensor's chunks are the pruned
        pieces when each keeps the same count; fixed sizes or bounds (``split(64)``) would not
        move with the cut: those channels are pinned."""
        x_t, x = inputs[0]
        dim = arg(args, kwargs, 2 if op != "unbind" else 1, "dim", 0 if op != "hsplit" else 1)
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
                self.fresh(p, f"{self.where()}: a piece of unbind over the channels")
            return
        sizes = [p.shape[1] for p in pieces]
        count = arg(args, kwargs, 1, "chunks" if op == "chunk" else "sections")
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
        # what is written keeps its place and its width: kept, with every channel before it
        self.g.pin(x.slice(0, max(positions) + 1) if not self.from_end(idx) else x,
                   f"{self.where()}: {op} into channels by fixed bounds")
        v = self.get(value)
        if v is None or v.channels != len(positions):
            v = Map([Seg(self.g.new_space(len(positions), f"{self.where()}: written by {op}"), 0,
                         len(positions), False)])
        parts = {p: v.slice(i, i + 1).segs[0] for i, p in enumerate(positions)}
        segs = [parts.get(p) or x.slice(p, p + 1).segs[0] for p in range(x_t.shape[1])]
        merged = Map([])
        for s in segs:
            merged = Map(merged.segs + [s]) if not merged.segs or not joins(merged.segs[-1], s) \
                else Map(merged.segs[:-1] + [Seg(s.space, merged.segs[-1].start,
                                                 merged.segs[-1].length + 1, s.gated)])
        self.set(x_t, merged)

    def op_zeros_like(self, op, args, kwargs, out, inputs) -> None:
        self.set(out, inputs[0][1].with_gate(True))

    def op_ones_like(self, op, args, kwargs, out, inputs) -> None:
        self.set(out, inputs[0][1].with_gate(False))

    op_empty_like = op_full_like = op_rand_like = op_randn_like = op_ones_like


def keeps_channels(op: str, args, kwargs, n: int) -> bool:
    """Whether a permutation leaves dims 0 and 1 where they are."""
    if op == "permute":
        dims = args[1] if len(args) == 2 and isinstance(args[1], (list, tuple)) else args[1:]
        dims = kwargs.get("dims", dims)
        return len(dims) >= 2 and dims[0] % n == 0 and dims[1] % n == 1
    if op in ("transpose", "swapaxes"):
        a, b = arg(args, kwargs, 1, "dim0"), arg(args, kwargs, 2, "dim1")
        return isinstance(a, int) and isinstance(b, int) and not {a % n, b % n} & {0, 1}
    return False


def joins(a: Seg, b: Seg) -> bool:
    return a.space == b.space and a.start + a.length == b.start and a.gated == b.gated
