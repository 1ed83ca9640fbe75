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
    ``self.get`` / ``self.set``, build the graph ``self.g``, name the module at ``self.where()``,
    hand what they cannot follow to ``self.opaque`` and follow sizes only where ``self.sized``
    and ``self.follow_sizes`` allow (which ``slimming.pruning.trace``'s walk provides). Each
    takes the op's name, its arguments, its result and its mapped inputs."""

    def combine(self, op: str, args, out, inputs) -> None:
        """A sum or product: operands of the output's channel count are tied; one channel or a
        number broadcasts (a product keeps zeros; a sum keeps them only where what it adds is
        zero)."""
        maps = [m for _, m in inputs]
        if not isinstance(out, torch.Tensor) or out.dim() < 2:
            return self.opaque(op, "a result without channels", maps, out)
        dims = {m.dim for m in maps}
        if len(dims) > 1:
            return self.opaque(op, "operands with their channels in different dimensions", maps, out)
        d = dims.pop()
        c = out.shape[d]
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
                lead = a.dim() - out.dim() + d
                if lead >= 0 and a.shape[lead] == c > 1:
                    scale = self.channel_tensor(a, c, lead)  # a layer scale: cut with its channels
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
        """Shape changes: a permutation moves the channel dimension (channels-last and back); a
        view keeps it where the dimensions before it keep their product (tokens (N, H*W, C)),
        flattens (N, C, ...) to (N, C*k), splits it into blocks (attention heads: the same
        positions cut in every block) or merges it with the blocks before it."""
        x_t, x = inputs[0]
        before, after = tuple(x_t.shape), tuple(out.shape) if isinstance(out, torch.Tensor) else None
        if op.endswith("_as"):  # view_as(other): the other tensor gives a shape only
            inputs = [(t, m) for t, m in inputs if t is x_t]
        if after is None or len(inputs) > 1 or x_t is not args[0]:
            return self.opaque(op, "a reshape of several tensors", [m for _, m in inputs], out)
        if op in PERMUTE_OPS:
            perm = permutation(op, args, kwargs, len(before))
            if perm is None or (x.factor != 1 and perm[:2] != [0, 1]):
                return self.opaque(op, "a permutation of flattened channels", [x], out)
            return self.set(out, x.at(perm.index(x.dim)))
        d = x.dim
        if op in ("expand", "expand_as"):  # new leading dims; size-1 dims grow
            lead = len(after) - len(before)
            if lead >= 0 and after[d + lead] == before[d]:
                return self.set(out, x.at(d + lead))
            return self.opaque(op, "an expand of the channels", [x], out)
        if x.factor != 1:
            if len(after) == 2 and after == before[:2]:
                return self.set(out, x)
            return self.opaque(op, "a reshape of flattened channels", [x], out)
        head, c = math.prod(before[:d]), before[d]
        prefix = [math.prod(after[:k]) for k in range(len(after) + 1)]
        for k in range(len(after)):  # the channel dim as it was, after dims of the same product
            if prefix[k] == head and after[k] == c:
                return self.set(out, x.at(k))
        if d == 1 and len(after) == 2 and after[0] == before[0]:  # (N, C, H, W) -> (N, C*H*W)
            return self.set(out, Map(x.segs, math.prod(before[2:]), 1))
        for k in range(len(after)):  # split into blocks: (N, heads * D, L) -> (N, heads, D, L)
            for j in range(k + 1, len(after)):
                if prefix[k] == head and prefix[j + 1] == head * c and after[j] > 1 and self.follow_sizes:
                    return self.set(out, self.blocks(x, c // after[j], op, after[k:j]).at(j))
        inner, starts = math.prod(before[d + 1:]), {math.prod(before[:m]) for m in range(d)}
        for k in range(len(after)):  # merged with the dims before it: (N, L, heads, D) -> (N, L, C)
            outer = after[k] // c if c and after[k] % c == 0 else 0
            if outer > 1 and prefix[k] * outer == head and prefix[k] in starts \
                    and math.prod(after[k + 1:]) == inner:
                heads = self.g.heads.get(x.segs[0].space) if len(x.segs) == 1 else None
                if heads is not None and len(heads[1]) == outer == before[d - 1]:  # heads merged, in order
                    s = x.segs[0]
                    merged = Map([Seg(p, s.start, s.length, s.gated) for p in heads[1]], 1, k)
                    self.g.merges.setdefault(self.stack[-1], []).append(merged)  # its width: an attribute's
                    return self.set(out, merged)
                return self.set(out, Map(x.segs * outer, 1, k))  # channel c at every block
        # Kept, not followed: a channel shuffle's view, transpose, view interleaves the channels
        # of its groups (the same positions would have to be cut in channels the graph keeps
        # apart); a flatten of channels-last channels puts them innermost; other reshapes mix
        # the channels with other dimensions
        what = "a reshape that moves the channels"
        if any(prefix[k] == head and prefix[j + 1] == head * c for k in range(len(after))
               for j in range(k + 1, len(after))):
            what = "a reshape that splits the channels into blocks (attention heads), not followed with " \
                "cut_heads=False"
        elif any(prefix[k] == head and n > c and n % c == 0 for k, n in enumerate(after)):
            what = "a reshape that interleaves the channels with a dimension after them (a channel shuffle)"
        self.opaque(op, f"{what}: {before} to {after}", [x], out)

    def blocks(self, x: Map, count: int, op: str, shape: tuple[int, ...] = ()) -> Map:
        """The channels of ``x`` split into ``count`` equal blocks laid along dimensions of
        their own (``shape``: attention heads, the paths of a selective kernel): one position
        of the channel dimension is a channel of every block, so the blocks are cut alike (tied
        position by position); their map. Where one of those dimensions is the number of heads
        the module holds (``num_heads``) and ``x`` is a layer's whole output, each block is
        also known as its head's (``head_axis``), so that heads can be cut whole."""
        if count == 1:
            return x
        where = self.where()
        self.g.sized.append(where)
        n = x.channels // count
        self.g.split_sizes.append((where, n))
        cut = self.g.cut_into(x, [n] * count)
        pieces = cut or [x.slice(i * n, (i + 1) * n) for i in range(count)]
        # heads cut whole: not in a module kept (ignore, keep_whole), nor from channels kept already
        kept = not cut or self.in_ignored() or self.g.touches_pins(x)
        heads = None if kept else self.head_axis(shape)
        if heads is not None:  # the heads' channels: a space of their own, tied to every block
            axis, space = heads
            result = Map([Seg(self.g.new_space(n), 0, n, x.segs[0].gated)], x.factor, x.dim)
            firsts: dict[int, int] = {}
            for i, p in enumerate(pieces):
                h = i // math.prod(shape[axis + 1:]) % shape[axis]
                self.g.piece_head[p.segs[0].space] = (space, h)
                firsts.setdefault(h, p.segs[0].space)
            self.g.heads[result.segs[0].space] = (space, [firsts[h] for h in range(shape[axis])])
        else:
            result, pieces = pieces[0], pieces[1:]
        for p in pieces:
            result = self.g.tie(result, p, f"{where}: {op} into blocks it cannot cut alike")
        return result

    def head_axis(self, shape: tuple[int, ...]) -> tuple[int, int] | None:
        """(which of the block dimensions ``shape`` is the number of heads the running module
        holds, the heads' space): the dimension is the last of that size (an integer attribute
        named as the heads' number is: ``num_heads``, ``heads``), next to the head's own
        channels as in (3, heads, head_dim) (a wrong guess fails the check); the space is made
        the first time. None where there is none."""
        if not self.stack or not shape:
            return None
        where = self.stack[-1]  # the module's name ("" for the model itself)
        module = self.modules[where]
        held = [(a, getattr(module, a)) for a in HEAD_ATTRS if type(getattr(module, a, None)) is int]
        found = [(a, v, len(shape) - 1 - shape[::-1].index(v)) for a, v in held if v > 1 and v in shape]
        if len(found) != 1:
            return None
        attr, count, axis = found[0]
        known = self.g.head_modules.get(where)
        if known is None:
            known = self.g.head_modules[where] = (self.g.new_space(count), attr)
        elif self.g.sizes[known[0]] != count:
            return None
        return axis, known[0]

    def reduce(self, op: str, args, kwargs, out, inputs) -> None:
        """A reduction over other dims keeps the channels (pooling (N, C, H, W) to (N, C), or
        tokens (N, L, C) to (N, C)); one over the channels makes new ones from all of them."""
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
                return self.set(values, x.with_gate(gated).at(d - gone))
        if values.dim() == 0 or (after and after[0] == before[0]):  # over the channels: all count
            for _, m in inputs:  # a sum over zeroed channels is the same; a mean or max is not
                if op != "sum" or any(not s.gated for s in m.segs):
                    self.g.pin(m, f"{self.where()}: {op} over the channels")
            return self.fresh(values, f"{self.where()}: made by {op} over the channels")
        self.opaque(op, f"a reduction from {before} to {after}", [x], out)

    def op_roll(self, op, args, kwargs, out, inputs) -> None:
        """``roll`` along dims other than the channels' (a Swin window's cyclic shift of
        (N, H, W, C)) moves positions, not channels, and keeps zeros; along the channels, or
        over the flattened tensor (no ``dims``), it mixes them: kept."""
        x_t, x = inputs[0]
        dims = arg(args, kwargs, 2, "dims")
        dims = [dims] if isinstance(dims, int) else list(dims or ())
        if len(inputs) == 1 and dims and x.factor == 1 and all(k % x_t.dim() != x.dim for k in dims):
            return self.set(out, x)
        self.opaque(op, "a roll along the channels", [m for _, m in inputs], out)

    def op_cat(self, op, args, kwargs, out, inputs) -> None:
        parts = arg(args, kwargs, 0, "tensors")
        dim = arg(args, kwargs, 1, "dim", 0)
        maps = [self.get(t) for t in parts]
        at = {m.dim for m in maps if m is not None}
        d = at.pop() if len(at) == 1 else -1
        if dim % out.dim() == d and all(m is not None and m.factor == 1 for m in maps):
            return self.set(out, Map([s for m in maps for s in m.segs], 1, d))
        if d >= 0 and dim % out.dim() != d and out.dim() >= 2:
            # along another dim: the operands' channels are the same channels; a module's
            # parameter among them (a class token before the patch tokens) is cut with them
            params = [self.channel_tensor(t, out.shape[d], d) if m is None and isinstance(t, torch.Tensor)
                      and t.dim() == out.dim() else None for t, m in zip(parts, maps)]
            if all(m is not None or p is not None for m, p in zip(maps, params)):
                tracked = [m for m in maps if m is not None]
                result = tracked[0]
                for m in tracked[1:]:
                    result = self.g.tie(result, m, f"{self.where()}: cat of channels it cannot pair")
                for p in params:
                    if p is not None:
                        self.scale(*p, result)
                moved = any(p is not None and bool(t.detach().ne(0).any()) for t, p in zip(parts, params))
                return self.set(out, result.with_gate(False) if moved else result)
        self.opaque(op, f"a concatenation along dim {dim} of tensors it cannot pair",
                    [m for _, m in inputs], out)

    def op_stack(self, op, args, kwargs, out, inputs) -> None:
        """``stack`` ties its operands, as a concatenation along another dim does (the paths of
        a selective kernel); their channel dim moves by one where the new dim comes before it."""
        parts = arg(args, kwargs, 0, "tensors")
        maps = [self.get(t) for t in parts]
        at = {m.dim for m in maps if m is not None}
        if len(at) == 1 and all(m is not None and m.factor == 1 for m in maps):
            d = at.pop()
            result = maps[0]
            for m in maps[1:]:
                result = self.g.tie(result, m, f"{self.where()}: stack of channels it cannot pair")
            return self.set(out, result.at(d + (arg(args, kwargs, 1, "dim", 0) % out.dim() <= d)))
        self.opaque(op, "a stack of tensors it cannot pair", [m for _, m in inputs], out)

    def split(self, op: str, args, kwargs, out, inputs) -> None:
        """split / chunk / tensor_split / unbind: along the channels each piece gets its run of
        the map. ``chunk`` divides what it is given, so the pruned tensor's chunks are the pruned
        pieces when each keeps the same count; fixed sizes or bounds (``split(64)``) would not
        move with the cut: those channels are pinned."""
        x_t, x = inputs[0]
        dim = arg(args, kwargs, 2 if op != "unbind" else 1, "dim", 0 if op != "hsplit" else 1)
        pieces = list(out) if isinstance(out, (list, tuple)) else [out]
        if dim % x_t.dim() != x.dim:  # along another dim: each piece has the same channels
            gone = dim % x_t.dim() < x.dim
            for p in pieces:
                self.set(p, x if p.dim() == x_t.dim() else x.at(x.dim - gone) if x.factor == 1 else None)
            return
        if x.factor != 1:
            return self.opaque(op, "a split of flattened channels", [x], out)
        if op == "unbind":
            self.g.pin(x, f"{self.where()}: unbind over the channels")
            for p in pieces:
                self.fresh(p, f"{self.where()}: a piece of unbind over the channels")
            return
        sizes = [p.shape[x.dim] for p in pieces]
        count = arg(args, kwargs, 1, "chunks" if op == "chunk" else "sections")
        by_count = op == "chunk" or (op == "tensor_split" and isinstance(count, int))
        if by_count and len(set(sizes)) == 1 and len(pieces) > 1:
            maps = self.g.refine(x, len(pieces))
            if maps is None:
                self.g.equal_blocks(x, len(pieces), "chunk")
                maps = [x.slice(i * sizes[0], (i + 1) * sizes[0]) for i in range(len(pieces))]
        elif len(pieces) > 1 and self.sized(sizes) and (maps := self.g.split_all(x, sizes)) is not None:
            # sizes the module keeps in attributes (an attention's key_dim, head_dim): the cut
            # sets them (``surgery.update_widths``); pieces of one size keep equal counts
            self.g.sized.append(self.where())
            self.g.split_sizes += [(self.where(), n) for n in set(sizes)]
            for n in set(sizes):
                same = [m.segs for m, k in zip(maps, sizes) if k == n]
                if len(same) > 1:
                    self.g.equal.append(("chunk", same))
        else:
            if len(pieces) > 1:
                self.g.pin(x, f"{self.where()}: {op} into fixed sizes {sizes}")
            bounds = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
            maps = [x.slice(a, b) for a, b in zip(bounds, bounds[1:])]
        for p, m in zip(pieces, maps):
            self.set(p, m)

    def channel_index(self, idx, x_t: torch.Tensor, x: Map):
        """For ``x[idx]``: (the channel positions it reads (None: all, in order), the dim they
        are at in the result, the index's entry for them), or a string saying why it cannot be
        followed. Other dims may be sliced or picked by an integer (a class token:
        ``tokens[:, 0]``), not indexed by tensors."""
        idx = expand_index(idx, x_t.dim())
        pos, dim, at = 0, 0, None
        for k, i in enumerate(idx):
            if pos == x.dim and i is not None:
                at = k
                break
            if not isinstance(i, (slice, int)) and i is not None:
                return "advanced indexing of the other dimensions"
            dim += i is None or isinstance(i, slice)
            pos += i is not None
        if at is None:  # more entries than dims: torch refuses it too
            return "an index it does not know"
        if any(not isinstance(i, (slice, int)) and i is not None for i in idx[at + 1:]):
            return "advanced indexing of the other dimensions"
        c, i = x_t.shape[x.dim], idx[at]
        if isinstance(i, slice):
            return (None if i == slice(None) else list(range(c))[i]), dim, i
        if isinstance(i, torch.Tensor) and i.dtype == torch.bool:  # as long as the channels were
            return (i.nonzero().flatten().tolist(), dim, i) if i.dim() == 1 and len(i) == c \
                else "a mask of another shape"
        entry = i
        if isinstance(i, torch.Tensor):
            i = i.tolist()
        if isinstance(i, int):
            return "indexing one channel"
        if isinstance(i, (list, tuple)) and all(isinstance(v, int) for v in i):
            return [v % c for v in i], dim, entry
        return "an index it does not know"

    @staticmethod
    def from_end(i) -> bool:
        """Whether the channel entry of an index counts from the end (``x[:, -4:]``) or is a
        mask: then it names other channels once the tensor is narrower, and every channel is
        kept."""
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
        got = self.channel_index(idx, x_t, x)
        if isinstance(got, str) or (got[0] is not None and x.factor != 1):
            why = got if isinstance(got, str) else "a slice of flattened channels"
            return self.opaque(op, why, [x], out)
        positions, dim, entry = got
        if positions is None:
            return self.set(out, x.at(dim))
        self.pin_for_index(x, positions, x_t.shape[x.dim], op, self.from_end(entry))
        self.set(out, x.take(positions).at(dim))

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
        got = self.channel_index(idx, x_t, x)
        if isinstance(got, str) or x.factor != 1:
            return self.opaque(op, got if isinstance(got, str) else "flattened channels",
                               [m for _, m in inputs], None)
        positions, dim, entry = got
        c = x_t.shape[x.dim]
        positions = list(range(c)) if positions is None else positions
        # what is written keeps its place and its width: kept, with every channel before it
        self.g.pin(x.slice(0, max(positions) + 1) if not self.from_end(entry) else x,
                   f"{self.where()}: {op} into channels by fixed bounds")
        v = self.get(value)
        if v is None or v.channels != len(positions) or v.factor != 1 or v.dim != dim:
            v = Map([Seg(self.g.new_space(len(positions), f"{self.where()}: written by {op}"), 0,
                         len(positions), False)])
        parts = {p: v.slice(i, i + 1).segs[0] for i, p in enumerate(positions)}
        segs = [parts.get(p) or x.slice(p, p + 1).segs[0] for p in range(c)]
        merged = Map([], 1, x.dim)
        for s in segs:
            merged = Map(merged.segs + [s], 1, x.dim) if not merged.segs or not joins(merged.segs[-1], s) \
                else Map(merged.segs[:-1] + [Seg(s.space, merged.segs[-1].start,
                                                 merged.segs[-1].length + 1, s.gated)], 1, x.dim)
        self.set(x_t, merged)

    def op_matmul(self, op, args, kwargs, out, inputs) -> None:
        """``a @ b`` (and ``bmm``, ``mm``): channels along ``a``'s rows or ``b``'s columns, or
        along a batch dimension of both (attention heads), are the output's, zero where theirs
        are; channels both operands contract (a query against a key) are tied, cut alike, and
        leave no channels in the output (it is the same once the cut ones are zero on either
        side). Channels contracted against an untracked tensor (a raw weight) are kept."""
        a, b = arg(args, kwargs, 0, "input"), arg(args, kwargs, 1, "other", arg(args, kwargs, 1, "mat2"))
        ma, mb = self.get(a), self.get(b)
        maps = [m for _, m in inputs]
        if not all(isinstance(t, torch.Tensor) for t in (out, a, b)) \
                or min(a.dim(), b.dim()) < 2 or any(m.factor != 1 for m in maps):
            return self.opaque(op, "a product of flattened or one-dimensional channels", maps, out)
        n = out.dim()
        role_a = None if ma is None else "k" if ma.dim == a.dim() - 1 else "m" if ma.dim == a.dim() - 2 \
            else ma.dim + n - a.dim()
        role_b = None if mb is None else "k" if mb.dim == b.dim() - 2 else "n" if mb.dim == b.dim() - 1 \
            else mb.dim + n - b.dim()
        if role_a == "k" and role_b == "k":
            tied = self.g.tie(ma, mb, f"{self.where()}: {op} contracts channels it cannot pair", product=True)
            if any(not seg.gated for seg in tied.segs):
                self.g.pin(tied, f"{self.where()}: {op} contracts channels neither side zeroes")
            return self.set(out, None)  # the same in the pruned network: no channels of its own
        if "k" in (role_a, role_b):
            return self.opaque(op, "a product that contracts channels with an untracked tensor", maps, out)
        if role_a is not None and role_b is not None:
            if isinstance(role_a, int) and role_a == role_b:  # the same batch dim of both (heads)
                tied = self.g.tie(ma, mb, f"{self.where()}: {op} of channels it cannot pair", product=True)
                return self.set(out, tied.at(role_a))
            return self.opaque(op, "a product of channels along two dimensions", maps, out)
        m, role = (ma, role_a) if ma is not None else (mb, role_b)
        self.set(out, m.at(n - 2 if role == "m" else n - 1 if role == "n" else role))

    op_bmm = op_mm = op_matmul

    def op_scaled_dot_product_attention(self, op, args, kwargs, out, inputs) -> None:
        """``F.scaled_dot_product_attention(q, k, v)``: the queries' and keys' channels are
        contracted (tied, cut alike), the values' are the output's. Its default scale is
        1/sqrt(the width of q), which a cut would change: without ``scale=``, q and k are kept."""
        q, k, v = (arg(args, kwargs, i, key) for i, key in enumerate(("query", "key", "value")))
        mq, mk, mv = self.get(q), self.get(k), self.get(v)
        maps = [m for _, m in inputs]
        last = [m is None or (m.dim == t.dim() - 1 and m.factor == 1) for m, t in ((mq, q), (mk, k), (mv, v))]
        if not all(last) or not isinstance(out, torch.Tensor):
            return self.opaque(op, "attention over other than the last dimension's channels", maps, out)
        if mq is not None and mk is not None:
            tied = self.g.tie(mq, mk, f"{self.where()}: attention of queries and keys it cannot pair",
                              product=True)
            if any(not seg.gated for seg in tied.segs):
                self.g.pin(tied, f"{self.where()}: attention contracts channels neither side zeroes")
            if arg(args, kwargs, 6, "scale") is None:
                self.g.pin(tied, f"{self.where()}: {op} scales by the width of its queries (give scale=)")
        elif mq is not None or mk is not None:
            self.g.pin(mq or mk, f"{self.where()}: attention contracts channels with untracked ones")
        self.set(out, None if mv is None else mv.at(out.dim() - 1))

    def op_softmax(self, op, args, kwargs, out, inputs) -> None:
        """A softmax over another dimension (the paths of a selective kernel, the keys of
        attention) is per channel, and 0 does not stay 0; over the channels it mixes them."""
        x_t, x = inputs[0]
        dim = arg(args, kwargs, 1, "dim")
        if len(inputs) > 1 or not isinstance(dim, int) or dim % x_t.dim() == x.dim or x.factor != 1:
            return self.opaque(op, "a softmax over the channels", [m for _, m in inputs], out)
        self.set(out, x.with_gate(False))

    op_log_softmax = op_softmax

    def op_zeros_like(self, op, args, kwargs, out, inputs) -> None:
        self.set(out, inputs[0][1].with_gate(True))

    def op_ones_like(self, op, args, kwargs, out, inputs) -> None:
        self.set(out, inputs[0][1].with_gate(False))

    op_empty_like = op_full_like = op_rand_like = op_randn_like = op_ones_like


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


def expand_index(idx, n: int) -> tuple:
    """An index as a tuple with one entry per dim of an ``n``-dim tensor (``...`` and the
    missing trailing dims as full slices; ``None`` entries kept)."""
    idx = idx if isinstance(idx, tuple) else (idx,)
    named = sum(i is not None and i is not Ellipsis for i in idx)
    if any(i is Ellipsis for i in idx):
        k = next(k for k, i in enumerate(idx) if i is Ellipsis)
        idx = idx[:k] + (slice(None),) * (n - named) + idx[k + 1:]
    return idx + (slice(None),) * (n - sum(i is not None for i in idx))


def joins(a: Seg, b: Seg) -> bool:
    return a.space == b.space and a.start + a.length == b.start and a.gated == b.gated
