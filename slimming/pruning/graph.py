"""The channel graph of a network: which channels are tied together, and who makes, normalises
and reads them. ``slimming.pruning.trace`` builds it by running one forward; ``surgery`` cuts
along it; ``prune`` scores its groups.

The model: every tensor with a channel dimension (N, C, ...), or its flattened (N, C*k) form,
carries a *map*: a list of segments, each a run of channels of one *space*. A space is a set of
channels made by one producer (a convolution's or linear layer's outputs, the input image).
Element-wise ops, pooling and activations pass the map on; a depthwise convolution passes it
on (and is cut with it); a concatenation joins maps; a residual addition, or an element-wise
product such as squeeze-and-excitation's, *ties* the spaces of its operands (union-find):
their channels must be cut together. A set of tied spaces is a ``Group``; every scaling factor
(a BatchNorm's or GroupNorm's weight, ``slimming.layers.rules.is_factor_layer``) reading one of
its channels scores that channel. A ``chunk`` of a whole space *refines* it into
its pieces, each a space of its own that may be tied on its own (the C2f block of YOLO-style
detectors adds to one half only).

A group may lose channels only if the pruned network equals the original with those
channels' gamma and beta zeroed in every factor layer (BatchNorm, GroupNorm) of the group. What
would break that is *pinned*: positions of a group that are always kept. Pinned are the input, the model's
outputs, modules in ``ignore``, the positions before a channel slice's fixed bound (``x[:, :c]``
in the pruned network must still mean the same channels), splits by fixed sizes, tensors tied
by an op that cannot tie them channel by channel, channels something other than a factor layer
reads raw (before a factor layer of the group has zeroed them), and groups no factor scores.
A group with every position pinned is locked (``prunable`` False, ``reason`` says why).
Some sets of positions must keep equal counts (``equal``): the blocks of a grouped convolution
(cut by equal counts in every group, so that it stays a grouped convolution), the pieces of a
``chunk`` (so that chunking the pruned tensor gives the pruned pieces).
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple

import torch
from torch import nn

from ..errors import SlimmingError, clip
from ..layers.rules import RULES

UNSCORED = "no scaling factor (BatchNorm, GroupNorm, LayerNorm, affine InstanceNorm, gate) scores it"


class Reason(str):
    """Why channels are kept: the sentence users read (it is a ``str``), and what it says for
    code that decides by it (``add_gates``): ``kind`` ("unscored": nothing scores them;
    "read_first": ``module`` reads them before any factor; "kept":
    anything else)."""

    kind: str
    module: str | None

    def __new__(cls, text: str, kind: str = "kept", module: str | None = None) -> Reason:
        self = super().__new__(cls, text)
        self.kind, self.module = kind, module
        return self


class GraphError(SlimmingError):
    """A network whose channels the graph cannot follow; names the module and the op."""


@dataclass
class Seg:
    """``length`` channels of space ``space`` from ``start``; ``gated``: zero once the group's
    factors are zeroed (the output of a BatchNorm or GroupNorm, or of zero-preserving ops on one)."""

    space: int
    start: int
    length: int
    gated: bool


@dataclass
class Map:
    segs: list[Seg]
    factor: int = 1  # features per channel once flattened: (N, C, H, W) -> (N, C*H*W)
    dim: int = 1  # the tensor's channel dimension: 1 for (N, C, H, W), 3 for channels-last (N, H, W, C)

    @property
    def channels(self) -> int:
        return sum(s.length for s in self.segs)

    def with_gate(self, gated: bool | None) -> Map:
        """The same channels; ``gated`` None keeps each segment's own flag."""
        return Map([Seg(s.space, s.start, s.length, s.gated if gated is None else gated)
                    for s in self.segs], self.factor, self.dim)

    def at(self, dim: int) -> Map:
        """The same channels, at dimension ``dim`` of the tensor that carries them."""
        return Map(self.segs, self.factor, dim)

    def slice(self, start: int, stop: int) -> Map:
        """The channels at positions [start, stop) of this map."""
        out, pos = [], 0
        for s in self.segs:
            lo, hi = max(start, pos), min(stop, pos + s.length)
            if lo < hi:
                out.append(Seg(s.space, s.start + lo - pos, hi - lo, s.gated))
            pos += s.length
        return Map(out, self.factor, self.dim)

    def take(self, positions: list[int]) -> Map:
        """The channels at ``positions`` (in that order), runs merged into segments."""
        out: list[Seg] = []
        for p in positions:
            s = self.slice(p, p + 1).segs[0]
            last = out[-1] if out else None
            if last and last.space == s.space and last.start + last.length == s.start \
                    and last.gated == s.gated:
                last.length += 1
            else:
                out.append(s)
        return Map(out, self.factor, self.dim)


class Side(str, Enum):
    """Which of a layer's channels a ``Use`` is: those it reads, makes or carries (a BatchNorm,
    a depthwise convolution, a layer scale). The values are the keys of a module's masks."""

    IN = "in"
    OUT = "out"
    CHANNELS = "channels"


@dataclass
class Use:
    """A module that must be cut with the channels of ``map``: ``kind`` is its layer kind
    (``slimming.layers.rules.RULES``: ``conv``, ``linear``, ``bn``, ``depthwise``, ...; or
    ``scale``, a per-channel parameter; ``head_gate``), ``side`` which of its channels they are
    (``Side``). ``attrs``: which of its tensors played which part (``weight``: ``"weight"``, or
    a buffer such as a blur filter's ``"filt"``), so those are the ones cut."""

    module: str
    kind: str
    map: Map
    attrs: dict[str, str] = field(default_factory=dict)
    groups: int = 1  # a grouped convolution's groups; for a ``scale``, the dim of its channels
    side: Side = Side.CHANNELS

    @property
    def slot(self) -> str | ScaleSlot:
        """Which mask of its module this use gives: ``"in"`` (read), ``"out"`` (made),
        ``"channels"`` (carried), or a ``ScaleSlot`` (a per-channel parameter along a dim)."""
        if self.kind == "scale":
            return ScaleSlot(self.attrs["weight"], self.groups)
        return self.side.value


def scores(use: Use) -> bool:
    """Whether ``use`` carries channels its layer's scale factor scores (a BatchNorm's gamma)."""
    return use.side is Side.CHANNELS and use.kind in RULES and RULES[use.kind].scores


class ScaleSlot(NamedTuple):
    """A module's per-channel parameter (a layer scale) cut along ``dim``."""

    attr: str
    dim: int


@dataclass
class Kept:
    """An op the trace could not follow channel by channel: the channels it read (``maps``)
    are kept. ``kind``: the type of the module it ran in, ``module`` its name."""

    kind: str
    module: str
    op: str
    what: str
    maps: list[Map]


class Factor(NamedTuple):
    """A run of a group's channels that a factor layer (a BatchNorm, a GroupNorm) scores:
    positions ``pos`` to ``pos + count`` of ``layer`` are the group's channels ``start`` to
    ``start + count``."""

    layer: str
    pos: int
    start: int
    count: int


@dataclass
class Group:
    """Tied spaces of ``size`` channels each. ``bns``: the ``Factor`` runs that score them
    (BatchNorms, GroupNorms).
    ``pinned``: positions always kept (None: none). ``prunable`` False: every position is
    pinned, ``reason`` says why."""

    size: int
    spaces: list[int]
    bns: list[Factor] = field(default_factory=list)
    prunable: bool = True
    reason: str = ""
    pinned: torch.Tensor | None = None
    reasons: list[str] = field(default_factory=list)  # every reason a position is kept

    def __repr__(self) -> str:
        pinned = 0 if self.pinned is None else int(self.pinned.sum())
        names = sorted({b.layer for b in self.bns})
        shown = ", ".join(names[:3]) + (f", ... ({len(names)})" if len(names) > 3 else "")
        state = "prunable" if self.prunable else f"kept: {self.reason}"
        return f"Group({self.size} channels, {pinned} pinned, factors [{shown}], {state})"

    def free(self) -> torch.Tensor:
        """The positions selection may cut (bool, ``size``)."""
        return torch.ones(self.size, dtype=torch.bool) if self.pinned is None else ~self.pinned


def _chunks(segs: list[Seg], sizes: list[int]) -> list[list[Seg]]:
    m, out, pos = Map(segs), [], 0
    for n in sizes:
        out.append(m.slice(pos, pos + n).segs)
        pos += n
    return out


class ChannelGraph:
    """Spaces (union-find, with refinement), uses, pins and equal-count blocks; ``groups()``
    turns them into the groups selection scores and surgery cuts."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.parent: list[int] = []
        self.sizes: list[int] = []
        self.refined: dict[int, list[int]] = {}  # space -> the spaces of its pieces, in order
        self.uses: list[Use] = []
        self.pins: list[tuple[Seg, str]] = []  # channels always kept, and why
        # sets of blocks (each a list of segments) that keep equal counts, and what made them:
        # "chunk" (the pieces of one tensor) or "groups" (a grouped convolution's groups); or
        # "whole": blocks each kept or cut whole (a GroupNorm's groups)
        self.equal: list[tuple[str, list[list[Seg]]]] = []
        self.kept: list[Kept] = []  # ops that kept the channels they read
        # attention heads: module -> (its heads' space, the integer attribute holding their
        # number); a head's piece of the channels -> (heads' space, head); a head's channels
        # (tied in every head) -> (heads' space, one piece of each head, in order)
        self.head_modules: dict[str, tuple[int, str]] = {}
        self.piece_head: dict[int, tuple[int, int]] = {}
        self.heads: dict[int, tuple[int, list[int]]] = {}

    def __repr__(self) -> str:
        groups = self.groups()
        free = sum(int(g.free().sum()) for g in groups if g.prunable)
        return (f"ChannelGraph({len(groups)} groups, {sum(g.prunable for g in groups)} prunable, "
                f"{free} of {sum(g.size for g in groups)} channels free, {len(self.uses)} layer uses, "
                f"{len(self.kept)} ops kept whole)")

    def copy(self) -> ChannelGraph:
        """A copy to go on building (the model is shared, the bookkeeping is not)."""
        new = ChannelGraph.__new__(ChannelGraph)
        new.__dict__ = {k: copied(v) for k, v in self.__dict__.items()}
        return new

    # union-find over spaces
    def new_space(self, size: int, lock: str = "") -> int:
        self.parent.append(len(self.parent))
        self.sizes.append(size)
        space = len(self.parent) - 1
        if lock:
            self.pins.append((Seg(space, 0, size, False), lock))
        return space

    def find(self, s: int) -> int:
        while self.parent[s] != s:
            self.parent[s] = self.parent[self.parent[s]]
            s = self.parent[s]
        return s

    def resolve(self, m: Map) -> Map:
        """``m`` in terms of spaces that are not refined."""
        if not self.refined:
            return m
        out: list[Seg] = []
        for s in m.segs:
            pieces = self.refined.get(s.space)
            if pieces is None:
                out.append(s)
                continue
            whole = Map([Seg(p, 0, self.sizes[p], s.gated) for p in pieces])
            out.extend(self.resolve(whole.slice(s.start, s.start + s.length)).segs)
        return Map(out, m.factor, m.dim)

    def mask_of(self, m: Map, group_masks: dict[int, torch.Tensor]) -> torch.Tensor:
        """The keep-mask of ``m``'s channels (one per channel, before ``factor``): its groups'
        masks (absent: all kept), and nothing of a head the heads' mask cuts."""
        parts = []
        for seg in self.resolve(m).segs:
            whole = group_masks.get(self.find(seg.space))
            part = torch.ones(seg.length, dtype=torch.bool) if whole is None \
                else whole[seg.start:seg.start + seg.length]
            head = self.piece_head.get(seg.space)
            heads = None if head is None else group_masks.get(self.find(head[0]))
            if heads is not None and not bool(heads[head[1]]):
                part = torch.zeros(seg.length, dtype=torch.bool)
            parts.append(part)
        return torch.cat(parts) if parts else torch.ones(0, dtype=torch.bool)

    def heads_of(self, m: Map) -> tuple[int, int] | None:
        """(the heads' space, their number) where ``m`` is every head's channels merged in
        order, one whole piece of each (the input of an attention's output projection)."""
        segs = self.resolve(m).segs
        found = [self.piece_head.get(s.space) for s in segs]
        if not found or m.factor != 1 or any(h is None for h in found):
            return None
        space = found[0][0]
        if [h for _, h in found] != list(range(self.sizes[space])) or any(h[0] != space for h in found) \
                or any(s.start or s.length != self.sizes[s.space] for s in segs):
            return None
        return space, len(segs)

    def heads_made(self, piece: Map) -> int | None:
        """The space of the heads' channels made from blocks whose first is ``piece`` (the
        first head's), where there is one."""
        first = piece.segs[0].space
        return next((r for r, (_, firsts) in self.heads.items() if firsts and firsts[0] == first), None)

    def refine(self, m: Map, pieces: int) -> list[Map] | None:
        """Split the one whole, untied space ``m`` covers into ``pieces`` equal spaces of their
        own (linked by equal counts); None when ``m`` is not such a space."""
        size = sum(s.length for s in m.segs)
        if size % pieces:
            return None
        maps = self.cut_into(m, [size // pieces] * pieces)
        if maps is not None:
            self.equal.append(("chunk", [mp.segs for mp in maps]))
        return maps

    def cut_into(self, m: Map, sizes: list[int]) -> list[Map] | None:
        """Split the one whole, untied space ``m`` covers into spaces of ``sizes`` channels, in
        order; None when ``m`` is not such a space (a slice, a concatenation, tied already).
        A space cut so before (the same reshape met again by the training-mode forward) gives
        the same pieces."""
        again = self.pieces_of(m, sizes)
        if again is not None:
            return again
        m = self.resolve(m)
        if len(m.segs) != 1 or len(sizes) < 2:
            return None
        s = m.segs[0]
        size = self.sizes[s.space]
        if s.start or s.length != size or sum(sizes) != size or self.find(s.space) != s.space \
                or any(self.parent[o] == s.space for o in range(len(self.parent)) if o != s.space):
            return None
        new = [self.new_space(n) for n in sizes]
        self.refined[s.space] = new  # groups() skips it: its pieces are the spaces now
        return [Map([Seg(p, 0, n, s.gated)], m.factor, m.dim) for p, n in zip(new, sizes)]

    def split_all(self, m: Map, sizes: list[int]) -> list[Map] | None:
        """Split the whole space ``m`` covers, and every space tied to it, into runs of
        ``sizes`` channels, the runs of tied spaces tied again run by run (the queries, keys
        and values of every attention head); None when ``m`` is not one whole space. A space
        split so before gives the same runs."""
        again = self.pieces_of(m, sizes)
        if again is not None:
            return again
        m = self.resolve(m)
        if len(m.segs) != 1 or len(sizes) < 2:
            return None
        s = m.segs[0]
        root = self.find(s.space)
        if s.start or s.length != self.sizes[root] or sum(sizes) != s.length:
            return None
        members = [o for o in range(len(self.parent)) if o not in self.refined and self.find(o) == root]
        pieces = {}
        for o in members:
            pieces[o] = [self.new_space(n) for n in sizes]
            self.refined[o] = pieces[o]
        for o in members:
            for a, b in zip(pieces[members[0]], pieces[o]):
                if self.find(a) != self.find(b):
                    self.parent[self.find(b)] = self.find(a)
        return [Map([Seg(p, 0, n, s.gated)], m.factor, m.dim) for p, n in zip(pieces[s.space], sizes)]

    def pieces_of(self, m: Map, sizes: list[int]) -> list[Map] | None:
        """The pieces the whole space ``m`` covers was cut into before, where they have
        ``sizes`` channels in order; None otherwise."""
        s = m.segs[0] if len(m.segs) == 1 else None
        pieces = self.refined.get(s.space) if s is not None else None
        if pieces is None or s.start or s.length != self.sizes[s.space] \
                or [self.sizes[p] for p in pieces] != sizes:
            return None
        return [Map([Seg(p, 0, n, s.gated)], m.factor, m.dim) for p, n in zip(pieces, sizes)]

    def pin(self, m: Map, why: str) -> None:
        for seg in m.segs:
            self.pins.append((seg, why))

    def equal_blocks(self, m: Map, blocks: int, kind: str) -> None:
        """The ``blocks`` equal runs of ``m`` keep equal counts of channels (``kind``: "chunk"
        or "groups")."""
        if blocks > 1:
            n = m.channels // blocks
            self.equal.append((kind, _chunks(m.segs, [n] * blocks)))

    def whole_blocks(self, m: Map, blocks: int) -> None:
        """The ``blocks`` equal runs of ``m`` are each kept or cut whole (a GroupNorm's groups)."""
        if m.channels // blocks > 1:
            self.equal.append(("whole", _chunks(m.segs, [m.channels // blocks] * blocks)))

    def touches_pins(self, m: Map) -> bool:
        """Whether a pin made by now lies in a group ``m`` has channels in (any position)."""
        roots = {self.find(s.space) for s in self.resolve(m).segs}
        return any(self.find(s.space) in roots for seg, _ in self.pins for s in self.resolve(Map([seg])).segs)

    def pinned_everywhere(self, m: Map) -> bool:
        """Whether every channel of ``m`` is pinned by now (so no cut can reach it)."""
        m = self.resolve(m)
        roots = {self.find(s.space) for s in m.segs}
        cover: dict[int, torch.Tensor] = {}
        for seg, _ in self.pins:
            for s in self.resolve(Map([seg])).segs:
                r = self.find(s.space)
                if r in roots:
                    if r not in cover:
                        cover[r] = torch.zeros(self.sizes[r], dtype=torch.bool)
                    cover[r][s.start:s.start + s.length] = True
        none = torch.zeros(0, dtype=torch.bool)
        return all(bool(cover.get(self.find(s.space), none)[s.start:s.start + s.length].all())
                   and self.find(s.space) in cover for s in m.segs)

    def tie(self, a: Map, b: Map, why: str, product: bool = False) -> Map:
        """Channels of ``a`` and ``b`` are the same channels (a residual sum, an SE product).
        The result is zero where both are (a sum) or either is (a product). Operands whose
        channels cannot be tied one by one (different concatenations, slices of sets) are
        pinned instead: kept whole, they stay equal."""
        a, b = self.resolve(a), self.resolve(b)
        la, lb = [s.length for s in a.segs], [s.length for s in b.segs]
        if la != lb and sum(la) == sum(lb) and a.factor == b.factor and \
                (self.cut_into(a, lb) is not None or self.cut_into(b, la) is not None):
            # one side a whole space of its own, the other a concatenation (GhostNetV2's gate
            # times its cat of a layer's channels and their cheap copies): cut to match
            a, b = self.resolve(a), self.resolve(b)
            la, lb = [s.length for s in a.segs], [s.length for s in b.segs]
        if la == lb and a.factor == b.factor:
            pairs = []
            for sa, sb in zip(a.segs, b.segs):
                ra, rb = self.find(sa.space), self.find(sb.space)
                whole = sa.start == sb.start == 0 and sa.length == self.sizes[ra] == self.sizes[rb]
                if (ra != rb and not whole) or (ra == rb and sa.start != sb.start):
                    break
                pairs.append((ra, rb))
            else:
                out = []
                for (ra, rb), sa, sb in zip(pairs, a.segs, b.segs):
                    ra, rb = self.find(ra), self.find(rb)
                    if ra != rb:
                        self.parent[rb] = ra
                    gated = (sa.gated or sb.gated) if product else (sa.gated and sb.gated)
                    out.append(Seg(sa.space, sa.start, sa.length, gated))
                return Map(out, a.factor, a.dim)
        self.pin(a, why)
        self.pin(b, why)
        return a.with_gate(False)

    def groups(self) -> list[Group]:
        """The groups, ordered by their first factor layer in ``modules()`` order (so that ties in
        a global ranking break as the hand-written path breaks them)."""
        by_root: dict[int, Group] = {}
        for s in range(len(self.parent)):
            if s in self.refined:
                continue
            r = self.find(s)
            by_root.setdefault(r, Group(self.sizes[r], [])).spaces.append(s)
        reasons: dict[int, dict[str, None]] = {}

        def pin(seg: Seg, why: str) -> None:
            for s in self.resolve(Map([seg])).segs:
                r = self.find(s.space)
                g = by_root[r]
                if g.pinned is None:
                    g.pinned = torch.zeros(g.size, dtype=torch.bool)
                g.pinned[s.start:s.start + s.length] = True
                reasons.setdefault(r, {})[why] = None

        for seg, why in self.pins:
            pin(seg, why)
        readers = []
        for use in self.uses:
            m = self.resolve(use.map)
            if scores(use):
                pos = 0
                for seg in m.segs:
                    bns = by_root[self.find(seg.space)].bns
                    factor = Factor(use.module, pos, seg.start, seg.length)
                    if factor not in bns:  # a BN called twice
                        bns.append(factor)
                    pos += seg.length
            elif use.side is Side.IN:
                readers.append((use.module, m))
        for g in by_root.values():
            affine = [b for b in g.bns if getattr(self.model.get_submodule(b.layer), "weight", None)
                      is not None]
            if not affine:
                pin(Seg(g.spaces[0], 0, g.size, False), Reason(UNSCORED, "unscored"))
        for name, m in readers:  # a reader must see zeros where we cut
            for seg in m.segs:
                if not seg.gated:
                    pin(seg, Reason(f"{name} reads it before any BatchNorm or other scaling factor",
                                    "read_first", name))
        for r, g in by_root.items():
            g.reasons = list(reasons.get(r, ()))
            if g.pinned is not None and bool(g.pinned.all()):
                g.prunable, g.reason = False, g.reasons[0]
        groups = list(by_root.values())
        order = {name: i for i, (name, _) in enumerate(self.model.named_modules())}
        groups.sort(key=lambda g: min((order.get(b.layer, 1 << 30) for b in g.bns),
                                      default=1 << 30))
        return groups

    def blocks(self) -> list[tuple[str, list[list[tuple[int, int, int]]]]]:
        """The equal-count constraints: (kind, blocks of (group root, start, length) runs)."""
        return [(kind, [[(self.find(s.space), s.start, s.length) for s in self.resolve(Map(b)).segs]
                        for b in blocks]) for kind, blocks in self.equal]


def ignored_names(model: nn.Module, ignore) -> set[str]:
    """The qualified names of the modules ``ignore`` keeps whole: each entry a module's name or a
    module type (``nn.Linear``, a detection head's class), and everything inside what it names
    (``"head"`` keeps ``head.cv1`` too). SlimmingError for a name no module has (a typo would
    keep nothing) or an entry that is neither."""
    if ignore is None:
        return set()
    if not isinstance(ignore, (str, type, list, tuple, set, frozenset)):
        raise SlimmingError(f"ignore takes module names and module types (one, or a list), not "
                            f"{clip(repr(ignore))}", param="ignore")
    entries = (ignore,) if isinstance(ignore, (str, type)) else tuple(ignore)
    names = dict(model.named_modules())
    roots: set[str] = set()
    for entry in entries:
        if isinstance(entry, type) and issubclass(entry, nn.Module):
            roots |= {n for n, m in names.items() if isinstance(m, entry)}
        elif isinstance(entry, str):
            if not entry:  # the root's name: every module; more likely a mistake than meant
                raise SlimmingError("ignore names '', the whole model: name the modules to keep whole",
                                    param="ignore")
            if entry not in names:
                raise SlimmingError(f"ignore names {clip(entry)}, which is no module of "
                                    f"{type(model).__name__}", param="ignore")
            roots.add(entry)
        else:
            raise SlimmingError(f"ignore takes module names and module types, not {clip(entry)}",
                                param="ignore")
    return {n for n in names for r in roots if n == r or not r or n.startswith(r + ".")}


def structure_copy(module: nn.Module, memo: dict | None = None) -> nn.Module:
    """A copy of ``module``'s tree of modules (each module shallow-copied, its containers
    copied, a module shared in the tree copied once) still pointing at the same parameters and
    buffers. A fraction of ``copy.deepcopy``'s cost, which would copy every tensor."""
    memo = {} if memo is None else memo
    if id(module) in memo:
        return memo[id(module)]
    new = module.__class__.__new__(module.__class__)
    new.__dict__ = {k: _container_copy(v) for k, v in module.__dict__.items()}
    memo[id(module)] = new
    for key, child in module._modules.items():
        new._modules[key] = None if child is None else structure_copy(child, memo)
    return new


def _container_copy(v):
    """A dict, list or set of a module's ``__dict__`` copied (its items shared); a subclass by
    ``copy.copy``, which keeps its own attributes too (diffusers' ``FrozenDict`` config mirrors
    its keys as attributes, which ``.copy()`` drops), or shared where it refuses to be copied;
    anything else as it is."""
    if type(v) in (dict, list, set, OrderedDict):
        return v.copy()
    if isinstance(v, (dict, list, set)):
        try:
            return copy.copy(v)
        except Exception:  # frozen against its own copy: the forward reads it, the cut never writes it
            return v
    return v


def kept_summary(graph: ChannelGraph, limit: int = 6) -> str:
    """One line: by module type, the ops that kept channels a factor scores (and how
    many such channels, each counted once); empty when none did."""
    scored = set()
    for use in graph.uses:
        if scores(use) and "weight" in use.attrs:
            scored |= {graph.find(s.space) for s in graph.resolve(use.map).segs}
    rows: dict[tuple[str, str, str], tuple[set[str], dict[int, torch.Tensor]]] = {}
    for k in graph.kept:
        modules, cover = rows.setdefault((k.kind, k.op, k.what), (set(), {}))
        for m in k.maps:
            for s in graph.resolve(m).segs:
                r = graph.find(s.space)
                if r in scored:
                    got = cover.setdefault(r, torch.zeros(graph.sizes[r], dtype=torch.bool))
                    got[s.start:s.start + s.length] = True
                    modules.add(k.module)
    counts = [(int(sum(c.sum() for c in cover.values())), key, modules)
              for key, (modules, cover) in rows.items()]
    counts = sorted((c for c in counts if c[0]), key=lambda c: -c[0])
    parts = []
    for n, (kind, op, what), modules in counts[:limit]:
        names = sorted(modules)
        where = ", ".join(names[:2]) + (f", ... ({len(names)} modules)" if len(names) > 2 else "")
        parts.append(f"{op} ({what}) in {kind} [{where}] kept {n}")
    more = f"; and {len(counts) - limit} more" if len(counts) > limit else ""
    return "; ".join(parts) + more


def copied(value):
    """A list or dict copied one level down (a dict's lists too: the records the walk appends
    to), so that building on a copy leaves the original as it was."""
    if isinstance(value, list):
        return list(value)
    if isinstance(value, dict):
        return {k: list(v) if isinstance(v, list) else v for k, v in value.items()}
    return value


def pin_shared(graph: ChannelGraph) -> None:
    """A module used more than once (called twice, or met again by the training-mode
    forward) is one set of tensors, cut one way: where its uses of one slot do not come to
    the same channels (and heads), those channels and heads are kept; the rest of the
    network is still cut."""
    by_slot: dict[tuple, list[Map]] = {}
    for use in graph.uses:
        by_slot.setdefault((use.module, use.slot), []).append(use.map)
    for (module, _), maps in by_slot.items():
        if len(maps) < 2 or len({_signature(graph, m) for m in maps}) == 1:
            continue
        for m in maps:
            pin_heads(graph, m, f"{module} is used twice on different channels")


def pin_heads(graph: ChannelGraph, m: Map, why: str) -> None:
    """Every channel of ``m`` kept, and every head its channels are part of (heads are cut
    whole in a space of their own)."""
    graph.pin(m, why)
    for seg in (*m.segs, *graph.resolve(m).segs):  # a head's piece, or the heads' channels
        head = graph.piece_head.get(seg.space) or graph.heads.get(seg.space)
        if head is not None:
            graph.pin(Map([Seg(head[0], 0, graph.sizes[head[0]], False)]), why)


def _signature(graph: ChannelGraph, m: Map) -> tuple:
    """What ``mask_of`` reads of ``m``: its resolved runs, their groups and heads."""
    return m.factor, tuple((graph.find(s.space), s.start, s.length, graph.piece_head.get(s.space))
                           for s in graph.resolve(m).segs)
