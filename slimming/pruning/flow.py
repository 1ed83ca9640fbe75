"""Where values flow in the forward, beside its channels: two listeners of the one forward
``trace`` runs (``capture``), each with its own state, read by the channel walk
(``trace.Walk``) and its layer handlers (``layer_calls``).

``Inputs``: what the model's inputs became in tensors the channel walk does not track (a mean, a
mask), and where the forward read their values into Python (``if x.mean() > 0.3``): there its
path depends on the input's values, which one random input may not show (``trace`` follows a
second kind of input too; ``Coverage.value_reads``).

``Params``: which tensors are the model's parameters and buffers (``owner``); what was computed
from them alone (``alone``: a standardised weight, which ``layer_calls.computed`` takes as its
layer's); the 1-D tensors made row by row of them (``rows_of``: ``torch.cat((q_bias, k_bias,
v_bias))`` in EVA and BEiT, Swin-v2's ``qkv.bias.clone()`` with the keys' third zeroed), whose
rows are cut with the layer's output channels; and what ``F.pad`` made of what (``pads``: the
TensorFlow SAME padding a baked layer does again).

``compared_widths``: while the forward runs, the integer attributes of the user's own modules
are ``TrackedInt``s, which note where the user's code compares one as a number (``if
x.shape[-1] < self.c``, ``min(self.window, H)``): a cut that lowered such a width would change
what the forward decides, at every input size, and the trace keeps it.

``ReadWidth``: a channel width the user's code read off a traced tensor's shape (``B, N, C =
x.shape``), handed to the forward as the same int carrying that tensor's channels, so that a
reshape sized by it (``reshape.reshape``) follows that tensor, not an attribute that equals it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import weakref
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import nn

from .capture import Call
from .ops import META_OPS, Padded, arg, in_place, op_name, tensors

# Python reads of a tensor's values: the path the forward takes may depend on them
_READS = {"__bool__", "__float__", "__int__", "__index__", "item", "tolist", "__complex__"}


class Inputs:
    """What the inputs became, untracked (held weakly), and the Python reads of its values:
    ``reads`` names the module whose forward read them ("" for the model's own)."""

    def __init__(self, tracked: Callable[[torch.Tensor], object]):
        self.tracked = tracked  # the channel walk's map of a tensor (None: not tracked)
        self.derived: dict[int, weakref.ref] = {}
        self.reads: list[str] = []
        self.stack: list[str] = []

    def enter(self, name: str, m: nn.Module, args: tuple) -> None:
        self.stack.append(name)

    def leave(self, name: str, m: nn.Module, args: tuple, out) -> None:
        if self.stack and self.stack[-1] == name:
            self.stack.pop()

    def call(self, c: Call) -> None:
        if op_name(c.func) in META_OPS:
            return
        given = tensors(list(c.args) + list(c.kwargs.values()))
        if not any(self.tracked(t) is not None or self._derived(t) for t in given):
            return
        if getattr(c.func, "__name__", "") in _READS:
            self.reads.append(self.stack[-1] if self.stack else "")
        for t in tensors(c.out):
            if self.tracked(t) is None:
                self.derived[id(t)] = weakref.ref(t)

    def _derived(self, t: torch.Tensor) -> bool:
        ref = self.derived.get(id(t))
        return ref is not None and ref() is t

    def given(self, t: torch.Tensor) -> None:
        """``t``, an input of the model without channels (a timestep (N,), a scalar), counts as
        what the inputs became."""
        self.derived[id(t)] = weakref.ref(t)

    def became(self, t) -> bool:
        """Whether ``t`` is an untracked tensor computed from the inputs (a timestep's embedding)."""
        return isinstance(t, torch.Tensor) and self._derived(t)


class Piece(NamedTuple):
    """``length`` rows of a 1-D tensor a forward made, each the same row of ``module``'s
    ``attr`` (both None: rows of a constant, the zeros between a query's and a value's bias)."""

    module: str | None
    attr: str | None
    length: int


_ROW_COPIES = {"clone", "detach", "contiguous", "to", "float", "half", "bfloat16", "double", "type_as", "cpu",
               "cuda", "data"}
_ROW_CONSTANTS = {"zeros", "zeros_like", "ones", "ones_like", "full", "full_like", "new_zeros", "new_ones",
                  "new_full"}
_ROW_WRITES = {"zero", "fill", "mul", "add", "sub", "div", "setitem", "clamp", "neg"}  # by a number: per row


class Params:
    """Where the model's parameters and buffers go in the forward (see the module's text)."""

    def __init__(self, model: nn.Module):
        self.owner: dict[int, tuple[str, str]] = {}  # id of a parameter or buffer -> (module, attr)
        for name, m in model.named_modules():
            for attr, t in (*m._parameters.items(), *m._buffers.items()):
                if t is not None:
                    self.owner.setdefault(id(t), (name, attr))
        self.by_params: dict[int, weakref.ref] = {}  # untracked tensors computed from parameters alone
        self.rewritten: set[int] = set()  # parameters or buffers the forward wrote other values into
        self.rows: dict[int, tuple] = {}  # 1-D tensors made row by row -> (it, its Pieces)
        self.pads: dict[int, Padded] = {}  # F.pad's outputs: what each made, of what

    def enter(self, name: str, m: nn.Module, args: tuple) -> None:
        pass

    def leave(self, name: str, m: nn.Module, args: tuple, out) -> None:
        pass

    def call(self, c: Call) -> None:
        op = op_name(c.func)
        if op in META_OPS:
            return
        given = tensors(list(c.args) + list(c.kwargs.values()))
        target = c.args[0] if c.args and isinstance(c.args[0], torch.Tensor) else None
        writes = target is not None and in_place(c.func, c.args, c.kwargs, c.out)
        self._rows(op, c, writes, len(given))
        self._alone(op, c, given, writes)

    def channel_tensor(self, t: torch.Tensor, c: int, dim: int | None = None) -> tuple[str, str, int] | None:
        """(module, attribute, dim) when ``t`` is a module's parameter or buffer of ``c``
        values (or a view of one: ``gamma.view(1, -1, 1, 1)``), one per channel along ``dim``;
        or, where ``t``'s channels lie along ``dim``, a parameter with other dims too (a
        position embedding (1, L, C)) or a broadcast of one (a class token expanded to
        (N, 1, C))."""
        owner = self.owner
        base = t if id(t) in owner else t._base
        if base is None or id(base) not in owner:
            return None
        if base.numel() == c:
            dims = [i for i, n in enumerate(base.shape) if n == c]
            return (*owner[id(base)], dims[0]) if len(dims) == 1 else None
        if dim is None or base.dim() != t.dim() or not 0 <= dim < t.dim() or base.shape[dim] != c \
                or t.shape[dim] != c:
            return None
        for i, (n, b) in enumerate(zip(t.shape, base.shape)):  # ``base`` itself, or expanded
            if b != 1 and (b != n or t.stride(i) != base.stride(i)):
                return None
        return (*owner[id(base)], dim)

    def alone(self, t) -> bool:
        """Whether ``t`` was computed from parameters and buffers alone in the forward."""
        ref = self.by_params.get(id(t))
        return ref is not None and ref() is t

    def rows_of(self, t) -> tuple[Piece, ...] | None:
        """The rows of the 1-D tensor ``t``: a module's parameter or buffer, or one the forward
        made row by row of those and of constants; None for anything else."""
        if not isinstance(t, torch.Tensor) or t.dim() != 1:
            return None
        owner = self.owner.get(id(t))
        if owner is not None:
            return (Piece(*owner, len(t)),)
        entry = self.rows.get(id(t))
        return entry[1] if entry is not None and entry[0] is t else None

    def _rows(self, op: str, c: Call, writes: bool, given: int) -> None:
        """``rows`` after one call (of ``given`` tensor arguments): a concatenation of rows, a
        copy of them, a constant; an in-place write by numbers alone (a slice zeroed) keeps a
        tensor's rows, one by a tensor (which may hold other rows) forgets them."""
        args, kwargs, out = c.args, c.kwargs, c.out
        if writes:
            target = args[0]
            base = target if id(target) in self.rows else target._base
            if base is not None and id(base) in self.rows:
                by = args[2:] if op == "setitem" else args[1:]
                if op not in _ROW_WRITES or tensors(list(by) + list(kwargs.values())):
                    del self.rows[id(base)]
            return
        if not isinstance(out, torch.Tensor) or out.dim() != 1 or id(out) in self.owner:
            return
        pieces = None
        if op == "cat" and args and arg(args, kwargs, 1, "dim", 0) in (0, -1):
            parts = [self.rows_of(t) for t in args[0]]
            pieces = tuple(p for part in parts for p in part) if all(parts) else None
        elif op in _ROW_COPIES and args and given == 1 + (op == "type_as"):
            pieces = self.rows_of(args[0])
        elif op in _ROW_CONSTANTS and given <= (op.endswith("_like") or op.startswith("new_")):
            pieces = (Piece(None, None, len(out)),)
        if pieces and sum(p.length for p in pieces) == len(out):
            self.rows[id(out)] = (out, pieces)

    def _alone(self, op: str, c: Call, given: list[torch.Tensor], writes: bool) -> None:
        """``by_params`` after one call: what a call of parameters (and buffers) alone, or of
        what they became, gives is computed from them alone; an in-place write by anything else
        forgets its target (a buffer an observer fills from the input is no parameter's any
        more). ``pads``: what ``F.pad`` made, of what."""
        alone = bool(given) and all((id(t) in self.owner and id(t) not in self.rewritten) or self.alone(t)
                                    for t in given)
        if writes and not alone:
            self.by_params.pop(id(c.args[0]), None)
            if id(c.args[0]) in self.owner:
                self.rewritten.add(id(c.args[0]))
        elif alone and not writes:
            for t in tensors(c.out):
                self.by_params[id(t)] = weakref.ref(t)
        if op == "pad" and isinstance(c.out, torch.Tensor) and given:
            mode = arg(c.args, c.kwargs, 2, "mode", "constant")
            value = arg(c.args, c.kwargs, 3, "value", None)
            self.pads[id(c.out)] = Padded(c.out, given[0], arg(c.args, c.kwargs, 1, "pad"), mode, value)


_OWN = (os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class TrackedInt(int):
    """An integer attribute of the user's module while the trace's forward runs: the same int,
    which adds ``where`` (module, attribute, value) to ``seen`` when code that is neither torch's
    nor slimming's compares it by order."""

    def __new__(cls, value: int, where: tuple, seen: set):
        self = super().__new__(cls, value)
        self.where, self.seen = where, seen
        return self

    def _compared(self) -> None:
        if not sys._getframe(2).f_code.co_filename.startswith(_OWN):  # 0: here, 1: the operator
            self.seen.add(self.where)

    def __lt__(self, other):
        self._compared()
        return int.__lt__(self, other)

    def __le__(self, other):
        self._compared()
        return int.__le__(self, other)

    def __gt__(self, other):
        self._compared()
        return int.__gt__(self, other)

    def __ge__(self, other):
        self._compared()
        return int.__ge__(self, other)

    def __reduce__(self):  # a copy or a pickle made in the forward: the plain int
        return int, (int(self),)


INTS = (int, TrackedInt)  # what an integer attribute is, during the trace too


class ReadWidth(int):
    """A traced tensor's width as the user's code read it off the tensor's shape during the
    trace (``B, N, C = x.shape``: ``C``; ``x.size(-1)``): the same int, which says whose channels
    it is (``source``, the tensor's map), so that a reshape given it is known to be sized by
    that tensor, not by an attribute that equals it. Arithmetic on it gives plain ints."""

    def __new__(cls, value: int, source):
        self = super().__new__(cls, value)
        self.source = source
        return self

    def __reduce__(self):  # a copy or a pickle made in the forward: the plain int
        return int, (int(self),)


@contextlib.contextmanager
def compared_widths(model: nn.Module, found: list[tuple[str, str, int]]):
    """For the block, every integer attribute above 1 of the user's own modules (not torch's) is
    a ``TrackedInt``; ``found`` then gets (module, attribute, value) for each one the user's code
    compared by order. Every attribute is put back after."""
    seen: set[tuple[str, str, int]] = set()
    swapped = []
    for name, m in model.named_modules():
        if type(m).__module__.startswith("torch."):
            continue
        for key, value in list(vars(m).items()):
            if type(value) is int and value > 1 and not key.startswith("_"):
                vars(m)[key] = TrackedInt(value, (name, key, value), seen)
                swapped.append((m, key, value))
    try:
        yield
    finally:
        for m, key, value in swapped:
            if isinstance(vars(m).get(key), TrackedInt):
                vars(m)[key] = value
        found.extend(sorted(seen - set(found)))
