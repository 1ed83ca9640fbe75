"""Indexing: which channels ``x[idx]`` reads (slices, lists, masks, a class token's integer
on another dim), what fixed bounds pin (``x[:, :c]`` must name the same channels after the
cut), and ``x[idx] = value`` writing into channels. Handlers of the trace
(``slimming.pruning.ops.Step``).
"""

from __future__ import annotations

import torch

from .graph import Map, Seg
from .ops import Step, Walk


def channel_index(idx, x_t: torch.Tensor, x: Map):
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

def from_end(i) -> bool:
    """Whether the channel entry of an index counts from the end (``x[:, -4:]``) or is a
    mask: then it names other channels once the tensor is narrower, and every channel is
    kept."""
    if isinstance(i, slice):
        return any(v is not None and v < 0 for v in (i.start, i.stop))
    if isinstance(i, torch.Tensor):
        return i.dtype == torch.bool or bool((i < 0).any())
    return isinstance(i, (list, tuple)) and any(isinstance(v, int) and v < 0 for v in i)

def getitem(w: Walk, s: Step) -> None:
    op, func, args, kwargs, out, inputs = s
    x_t, idx = args[0], args[1]
    x = w.get(x_t)
    if x is None:  # the index is the tracked tensor (x[mask]): its values are read
        return w.opaque(op, "indexing by a tensor of channels", [m for _, m in inputs], out)
    got = channel_index(idx, x_t, x)
    if isinstance(got, str) or (got[0] is not None and x.factor != 1):
        why = got if isinstance(got, str) else "a slice of flattened channels"
        return w.opaque(op, why, [x], out)
    positions, dim, entry = got
    if positions is None:
        return w.set(out, x.at(dim))
    pin_for_index(w, x, positions, x_t.shape[x.dim], op, from_end(entry))
    w.set(out, x.take(positions).at(dim))

def pin_for_index(w: Walk, x: Map, positions: list[int], c: int, op: str,
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
        w.g.pin(x.slice(0, stop), f"{w.where()}: {op} of channels by fixed bounds")

def setitem(w: Walk, s: Step) -> None:
    op, func, args, kwargs, out, inputs = s
    x_t, idx, value = args[0], args[1], args[2]
    x = w.get(x_t)
    if x is None:
        return w.opaque(op, "writing tracked channels into an untracked tensor",
                           [m for _, m in inputs], None)
    got = channel_index(idx, x_t, x)
    if isinstance(got, str) or x.factor != 1:
        return w.opaque(op, got if isinstance(got, str) else "flattened channels",
                           [m for _, m in inputs], None)
    positions, dim, entry = got
    c = x_t.shape[x.dim]
    positions = list(range(c)) if positions is None else positions
    # what is written keeps its place and its width: kept, with every channel before it
    w.g.pin(x.slice(0, max(positions) + 1) if not from_end(entry) else x,
               f"{w.where()}: {op} into channels by fixed bounds")
    v = w.get(value)
    if v is None or v.channels != len(positions) or v.factor != 1 or v.dim != dim:
        v = Map([Seg(w.g.new_space(len(positions), f"{w.where()}: written by {op}"), 0,
                     len(positions), False)])
    parts = {p: v.slice(i, i + 1).segs[0] for i, p in enumerate(positions)}
    segs = [parts.get(p) or x.slice(p, p + 1).segs[0] for p in range(c)]
    merged = Map([], 1, x.dim)
    for s in segs:
        merged = Map(merged.segs + [s], 1, x.dim) if not merged.segs or not joins(merged.segs[-1], s) \
            else Map(merged.segs[:-1] + [Seg(s.space, merged.segs[-1].start,
                                             merged.segs[-1].length + 1, s.gated)], 1, x.dim)
    w.set(x_t, merged)

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
