"""Reshapes and heads: what a view, reshape, flatten, permutation or expand does to the channel
dimension (moves it, keeps it, flattens it, splits it into blocks or merges it with the blocks
before it), and the blocks an attention splits its channels into (its heads, cut whole where
the module holds their number). Handlers of the trace (``slimming.pruning.ops.Step``).
"""

from __future__ import annotations

import math

import torch

from .flow import INTS, ReadWidth, TrackedInt
from .graph import Map, Seg, pin_heads
from .ops import HEAD_ATTRS, PERMUTE_OPS, Step, Walk, permutation


def reshape(w: Walk, s: Step) -> None:
    """Shape changes: a permutation moves the channel dimension (channels-last and back); a
    view keeps it where the dimensions before it keep their product (tokens (N, H*W, C)),
    flattens (N, C, ...) to (N, C*k), splits it into blocks (attention heads: the same
    positions cut in every block) or merges it with the blocks before it."""
    op, func, args, kwargs, out, inputs = s
    x_t, x = inputs[0]
    before, after = tuple(x_t.shape), tuple(out.shape) if isinstance(out, torch.Tensor) else None
    if op.endswith("_as"):  # view_as(other): the other tensor gives a shape only
        inputs = [(t, m) for t, m in inputs if t is x_t]
    if after is None or len(inputs) > 1 or x_t is not args[0]:
        return w.opaque(op, "a reshape of several tensors", [m for _, m in inputs], out)
    if op in PERMUTE_OPS:
        perm = permutation(op, args, kwargs, len(before))
        if perm is None or (x.factor != 1 and perm[:2] != [0, 1]):
            return w.opaque(op, "a permutation of flattened channels", [x], out)
        return w.set(out, x.at(perm.index(x.dim)))
    d = x.dim
    if op in ("expand", "expand_as"):  # new leading dims; size-1 dims grow
        lead = len(after) - len(before)
        if lead >= 0 and after[d + lead] == before[d]:
            return w.set(out, x.at(d + lead))
        return w.opaque(op, "an expand of the channels", [x], out)
    if x.factor != 1:
        if len(after) == 2 and after == before[:2]:
            return w.set(out, x)
        return w.opaque(op, "a reshape of flattened channels", [x], out)
    head, c = math.prod(before[:d]), before[d]
    prefix = [math.prod(after[:k]) for k in range(len(after) + 1)]
    for k in range(len(after)):  # the channel dim as it was, after dims of the same product
        if prefix[k] == head and after[k] == c:
            if op in ("view", "reshape") and after != before:  # (N, self.dim, H * W): the width it
                w.traced.widths.split_sizes.append((w.running(), c))  # gave must follow the cut
                x = _read_width(w, s, x, k)
            return w.set(out, x.at(k))
    if d == 1 and len(after) == 2 and after[0] == before[0]:  # (N, C, H, W) -> (N, C*H*W)
        return w.set(out, Map(x.segs, math.prod(before[2:]), 1))
    for k in range(len(after)):  # split into blocks: (N, heads * D, L) -> (N, heads, D, L)
        for j in range(k + 1, len(after)):
            if prefix[k] == head and prefix[j + 1] == head * c and after[j] > 1 and w.follow_sizes:
                return w.set(out, blocks(w, x, c // after[j], op, after[k:j]).at(j))
    inner, starts = math.prod(before[d + 1:]), {math.prod(before[:m]) for m in range(d)}
    for k in range(len(after)):  # merged with the dims before it: (N, L, heads, D) -> (N, L, C)
        outer = after[k] // c if c and after[k] % c == 0 else 0
        if outer > 1 and prefix[k] * outer == head and prefix[k] in starts \
                and math.prod(after[k + 1:]) == inner:
            if not _width_follows(w, s, k):  # reshape(B, N, C), C read off the input's shape
                _kept_whole(w, x, f"a {op} to a width the module does not hold ({after[k]})", after[k])
            heads = w.g.heads.get(x.segs[0].space) if len(x.segs) == 1 else None
            if heads is not None and len(heads[1]) == outer == before[d - 1]:  # heads merged, in order
                seg = x.segs[0]
                merged = Map([Seg(p, seg.start, seg.length, seg.gated) for p in heads[1]], 1, k)
                w.traced.widths.merges.setdefault(w.stack[-1], []).append(merged)  # its width: an attribute's
            else:
                merged = Map(x.segs * outer, 1, k)  # channel c at every block
            if (attr := _held(w, s, k)) is not None:  # reshape(..., self.all_head_size): it follows the cut
                w.traced.widths.split_sizes.append((w.running(), after[k]))
                w.traced.widths.held.setdefault((w.running(), attr), []).append(merged)
            return w.set(out, merged)
    # what it gives keeps the layout its input had: channels last (tokens, heads) stay last
    w.opaque(op, f"{_not_followed(after, prefix, head, c)}: {before} to {after}", [x], out,
             len(after) - 1 if d == len(before) - 1 else d)


def _size_args(s: Step) -> tuple:
    """The sizes a view or reshape was given (``view(a, b)``, ``reshape((a, b))``, ``shape=``)."""
    sizes = s.kwargs.get("shape", s.args[1:])
    return tuple(sizes[0]) if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)) else tuple(sizes)


def _read_width(w: Walk, s: Step, x: Map, k: int) -> Map:
    """A view whose channels are sized by a number the module read off another tensor's shape:
    a split into the heads the running module holds (one, or more; diffusers' ``value.view(B,
    -1, attn.heads, key.shape[-1] // attn.heads)``), or the channels as they are, sized by
    another tensor's width itself (a ``ReadWidth``: timm's PVT-v2, ``self.sr(x).reshape(B, C,
    -1)``, ``C`` the input's): ``x``'s channels tied to that tensor's, so that the width it
    reads after the cut is ``x``'s own. ``x`` where the size is another."""
    sizes = _size_args(s)
    if not w.stack or k == 0 or len(sizes) != s.out.dim():
        return x
    if _another_width(sizes[k], x):
        return w.g.tie(x, sizes[k].source, f"{w.where()}: a {s.op} to another tensor's width, read off "
                       "its shape")
    if type(sizes[k]) is not int:
        return x
    module = w.modules[w.stack[-1]]
    heads = {int(getattr(module, a)) for a in HEAD_ATTRS if type(getattr(module, a, None)) in INTS}
    source = w.read.get((w.stack[-1], sizes[k]))
    if source is None or s.out.shape[k - 1] not in heads:
        return x
    return w.g.tie(x, source, f"{w.where()}: a {s.op} to a width read off another tensor's shape")


def _held(w: Walk, s: Step, k: int) -> str | None:
    """The integer attribute of the module running that sizes dimension ``k``, read as it is
    (a ``TrackedInt`` of that module: Hugging Face's ``all_head_size``, TinyViT's ``out_dim``);
    None where the size is not one (a number that only equals one)."""
    sizes = _size_args(s) if s.op in ("view", "reshape") else ()
    size = sizes[k] if len(sizes) == s.out.dim() else None
    return size.where[1] if isinstance(size, TrackedInt) and size.where[0] == w.running() else None


def _width_follows(w: Walk, s: Step, k: int) -> bool:
    """Whether the size a view or reshape gives its dimension ``k`` (the channels merged with
    the blocks before them) follows a cut: -1 (computed), or an integer attribute of the module
    running, which the cut sets (``surgery.update_widths``); not a number read off another
    tensor's shape (EVA's ``reshape(B, N, C)`` after its heads, ``C`` its input's; also where
    that number equals an attribute, PVT-v2's ``self.dim``: the trace gave ``C`` as a ``ReadWidth``)."""
    if s.op not in ("view", "reshape") or not w.stack:
        return True
    sizes = _size_args(s)
    if len(sizes) != s.out.dim() or not isinstance(sizes[k], int) or sizes[k] == -1:
        return True
    if _another_width(sizes[k], s.inputs[0][1]):
        return False  # another tensor's width, read off its shape (PVT-v2's C, which equals self.dim)
    return sizes[k] in {int(v) for v in vars(w.modules[w.stack[-1]]).values() if type(v) in INTS}


def _another_width(size, x: Map) -> bool:
    """Whether ``size`` is a width read off the shape of a tensor whose channels are not ``x``'s."""
    if not isinstance(size, ReadWidth):
        return False
    return {seg.space for seg in size.source.segs} != {seg.space for seg in x.segs}


def _kept_whole(w: Walk, x: Map, what: str, size: int) -> None:
    """A size the cut cannot set, which may be read off the module's input (``B, N, C =
    x.shape``): ``x``'s channels and heads are kept, and so are the channels the running module reads
    (``Walk.leave``), as ``keep_whole`` keeps them. Where ``x``'s channels were kept already,
    only an input of ``size`` channels (``C`` itself) is kept: the size may be a spatial one
    (``H``, ``W``), which no cut changes."""
    why = f"{w.where()}: {what}, which the cut cannot set"
    kept = w.g.pinned_everywhere(x)
    pin_heads(w.g, x, why)
    w.whole_at_leave[w.stack[-1]] = (why, size if kept else None)


def _not_followed(after: tuple, prefix: list[int], head: int, c: int) -> str:
    """Why a reshape is kept, not followed: a channel shuffle's view, transpose, view
    interleaves the channels of its groups (the same positions would have to be cut in channels
    the graph keeps apart); a flatten of channels-last channels puts them innermost; other
    reshapes mix the channels with other dimensions."""
    if any(prefix[k] == head and prefix[j + 1] == head * c for k in range(len(after))
           for j in range(k + 1, len(after))):
        return "a reshape that splits the channels into blocks (attention heads), not followed with " \
            "cut_heads=False"
    if any(prefix[k] == head and n > c and n % c == 0 for k, n in enumerate(after)):
        return "a reshape that interleaves the channels with a dimension after them (a channel shuffle)"
    return "a reshape that moves the channels"

def blocks(w: Walk, x: Map, count: int, op: str, shape: tuple[int, ...] = ()) -> Map:
    """The channels of ``x`` split into ``count`` equal blocks laid along dimensions of
    their own (``shape``: attention heads, the paths of a selective kernel): one position
    of the channel dimension is a channel of every block, so the blocks are cut alike (tied
    position by position); their map. Where one of those dimensions is the number of heads
    the module holds (``num_heads``) and ``x`` is a layer's whole output, each block is
    also known as its head's (``head_axis``), so that heads can be cut whole."""
    if count == 1:
        return x
    where = w.where()
    w.traced.widths.sized.append(where)
    n = x.channels // count
    w.traced.widths.split_sizes.append((w.running(), n))
    cut = w.g.cut_into(x, [n] * count)
    pieces = cut or [x.slice(i * n, (i + 1) * n) for i in range(count)]
    made = w.g.heads_made(cut[0]) if cut else None
    if made is not None:  # met again (the training-mode forward): the heads' channels made then
        return Map([Seg(made, 0, n, x.segs[0].gated)], x.factor, x.dim)
    # heads cut whole: not in a module kept (ignore, keep_whole), nor from channels kept already
    kept = not cut or w.in_ignored() or w.g.touches_pins(x)
    heads = None if kept else head_axis(w, shape)
    if heads is not None:  # the heads' channels: a space of their own, tied to every block
        axis, space = heads
        result = Map([Seg(w.g.new_space(n), 0, n, x.segs[0].gated)], x.factor, x.dim)
        firsts: dict[int, int] = {}
        for i, p in enumerate(pieces):
            h = i // math.prod(shape[axis + 1:]) % shape[axis]
            w.g.piece_head[p.segs[0].space] = (space, h)
            firsts.setdefault(h, p.segs[0].space)
        w.g.heads[result.segs[0].space] = (space, [firsts[h] for h in range(shape[axis])])
    else:
        result, pieces = pieces[0], pieces[1:]
    for p in pieces:
        result = w.g.tie(result, p, f"{where}: {op} into blocks it cannot cut alike")
    return result

def head_axis(w: Walk, shape: tuple[int, ...]) -> tuple[int, int] | None:
    """(which of the block dimensions ``shape`` is the number of heads the running module
    holds, the heads' space): the dimension is the last of that size (an integer attribute
    named as the heads' number is: ``num_heads``, ``heads``), next to the head's own
    channels as in (3, heads, head_dim) (a wrong guess fails the check); the space is made
    the first time. None where there is none."""
    if not w.stack or not shape:
        return None
    where = w.stack[-1]  # the module's name ("" for the model itself)
    module = w.modules[where]
    held = [(a, int(getattr(module, a))) for a in HEAD_ATTRS if type(getattr(module, a, None)) in INTS]
    found = [(a, v, len(shape) - 1 - shape[::-1].index(v)) for a, v in held if v > 1 and v in shape]
    if len(found) != 1:
        return None
    attr, count, axis = found[0]
    known = w.g.head_modules.get(where)
    if known is None:
        known = w.g.head_modules[where] = (w.g.new_space(count), attr)
    elif w.g.sizes[known[0]] != count:
        return None
    return axis, known[0]
