"""``trace``: the channel graph of a network (``slimming.pruning.graph``), built by one real
forward of the example input in eval mode, and the records beside it (``Traced``: widths, baked
weights, coverage). ``slimming.pruning.capture`` runs the forward and tells what ran to three
listeners, each with its own state: what the inputs became and where parameters went
(``slimming.pruning.flow``), and the channel walk here, which keeps the channel map of every
tensor and hands each call to the handler of its op (``register.DISPATCH``; ``slimming.pruning.ops``,
``reshape``, ``index``) or of its layer (``slimming.pruning.layer_calls``, by the rules of
``slimming.layers.rules``: a layer is known by the function it calls with one module's tensors,
a rule with no such function by its module, followed whole). Module boundaries keep the stack
of modules for messages and ``ignore``. A module called twice (a head shared across levels)
makes the same channels both times, and its two inputs are cut alike.

The trace follows the path the example input takes. Layers it did not reach in eval mode are
looked for once more in a training-mode forward (auxiliary heads that only run in training),
with every buffer restored after; what neither reached keeps all its channels and is named in
a warning. A forward that reads values of what its input became into Python (``if x.mean() >
0.3``) may take another path on other values: it is followed once more on images in [0, 1]
(``images_like``), in the same graph, so that both paths' channels are followed.

Decided at the end, not at the op: an op whose channels cannot be followed one by one (an
attention reshape it cannot pair, an RMSNorm over the channels, an op it does not know) keeps
every channel it reads (pinned) and makes new channels that are kept whole; the rest of the
network is still cut, exactly. One warning lists, by module type, each such op that kept
channels a BatchNorm scores (most sit on channels nothing scores, and say nothing). An in-place
write through a view or alias of a tensor keeps the channels of every tensor sharing its memory.
"""

from __future__ import annotations

import inspect
import warnings
from collections import defaultdict
from collections.abc import Iterator

import torch
from torch import nn

from ..errors import SlimmingError, first_line
from ..layers.attention import decomposed
from ..layers.rules import RULES, is_layer, module_kind
from ..utils.modules import modes_kept
from .capture import Call, CaptureError, capture
from .flow import INTS, Inputs, Params, ReadWidth, compared_widths
from .graph import (
    ChannelGraph,
    GraphError,
    Kept,
    Map,
    Seg,
    Use,
    ignored_names,
    kept_summary,
    pin_heads,
    pin_shared,
)
from .layer_calls import baked_left, layer, owned, whole_layer
from .ops import (
    META_OPS,
    RESHAPE_OPS,
    Step,
    in_place,
    leaves,
    op_name,
    picker,
    tensors,
)
from .register import DISPATCH, OP_ALIASES, calls
from .register import register_op as register_op  # 0.2.0's path: slimming.pruning.trace.register_op
from .traced import Traced

# ops whose first use of a position embedding starts following its channels (``_embedding``);
# not ``expand``: a class token expanded over the batch is cut where it meets the tokens (``cat``)
EMBEDDING_OPS = (RESHAPE_OPS - {"expand", "expand_as"}) | {"getitem"}


def as_inputs(example_inputs) -> tuple:
    """The model's positional inputs: one tensor, or a tuple or list of them (and of other
    values, passed as they are)."""
    return tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)


def positional(model: nn.Module, example_inputs):
    """``example_inputs`` as positional inputs: a dict of the forward's keyword arguments
    (Torch-Pruning's and Hugging Face's way: ``{"sample": x, "timestep": t}``) bound to its
    signature, the parameters between them at their defaults; anything else as it is.
    SlimmingError (param ``example_inputs``) for a name the forward does not take, or one it
    takes only by keyword."""
    if not isinstance(example_inputs, dict):
        return example_inputs
    try:
        signature = inspect.signature(model.forward)
        bound = signature.bind_partial(**example_inputs)
    except (TypeError, ValueError) as e:
        raise SlimmingError(f"example_inputs: {type(model).__name__}.forward does not take these keyword "
                            f"arguments ({first_line(e, 80)})", param="example_inputs") from None
    only = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.VAR_KEYWORD)
    by_keyword = sorted(n for n in example_inputs
                        if n not in signature.parameters or signature.parameters[n].kind in only)
    if by_keyword:
        raise SlimmingError(f"example_inputs: {', '.join(by_keyword)} can be given only by keyword to "
                            f"{type(model).__name__}.forward, which slimming does not follow yet; pass the "
                            "forward's inputs by position (a tuple)", param="example_inputs")
    bound.apply_defaults()
    return tuple(bound.args)


def trace(model: nn.Module, example_inputs, ignore=(), keep_whole=(),
          follow_sizes: bool = True, output_transform=None, refused=(), more_inputs=()) -> Traced:
    """Run ``model`` (left unchanged, every module's train/eval flag restored) on
    ``example_inputs`` (a tensor (N, C, ...), or a tuple of the forward's inputs) in eval mode
    and build its channel graph. ``ignore``: modules whose own channels are kept (what they
    make, and their inner widths), while the channels they read are cut where their producers
    are; ``keep_whole``: modules kept whole, the channels they read too. Each by name (a name
    keeps what is inside it too) or by type (``ignored_names``). ``follow_sizes``: follow the
    reshapes that split channels into blocks (attention heads) and the splits by sizes a module
    keeps in integer attributes (queries, keys and values); the pruned forward then reads
    widths the cut must set (``surgery.update_widths``), which only the check can vouch for, so
    False keeps those channels. ``output_transform``: what of the model's output keeps its
    channels (default: all of it; a detector's ``lambda out: out[0]`` leaves the features its
    head passes out free to be cut). ``refused``: blocks kept whole as ``keep_whole`` keeps
    them because a cut of them failed (``prune``'s retries), and named so. ``more_inputs``:
    batches whose paths are followed too where the forward reads values (``prune``'s
    ``check_inputs``: the user's own value range). Returns what it
    found (``Traced``: the channel graph, and the widths, baked weights and coverage beside
    it). GraphError (one line) for a model that does not run on the example."""
    inputs = as_inputs(example_inputs)
    shapes = [tuple(t.shape) for t in inputs if isinstance(t, torch.Tensor)]
    if not any(len(shape) >= 2 for shape in shapes):
        raise GraphError(f"the model's inputs are {shapes or 'no tensors'}: slimming needs a tensor "
                         "with a channel dimension (N, C, ...)")
    keep = ignored_names(model, ignore)
    # module -> why it is kept whole, as the messages say it
    refusal = "is kept whole (a cut of it failed the check, as warned)"
    whole = {**dict.fromkeys(ignored_names(model, refused), refusal),
             **dict.fromkeys(ignored_names(model, keep_whole), "is in keep_whole")}
    walk = Walk(model, keep | whole.keys(), whole, follow_sizes=follow_sizes,
                output_transform=output_transform)
    with modes_kept(model), decomposed(model):
        walk.run(inputs, training=False)
        go_on = (keep | whole.keys(), whole, follow_sizes, output_transform)
        if walk.traced.coverage.value_reads:  # its path depends on values: images in [0, 1] may take another
            walk = _continued(walk, *go_on, images_like(inputs), False)
            for batch in more_inputs:
                walk = _continued(walk, *go_on, tuple(batch), False)
        if walk.unseen():  # layers that run only in training (auxiliary heads), at a batch of 2
            twice = tuple(torch.cat([t, t]) if isinstance(t, torch.Tensor) else t for t in inputs)
            walk = _continued(walk, *go_on, twice, True)
    walk.finish()
    return walk.traced


def images_like(inputs: tuple) -> tuple:
    """Each floating input tensor as an image in [0, 1] of its shape (a fixed seed), the other
    inputs as they are: the second kind of input ``trace`` and ``prune``'s check use where the
    forward reads values (``if x.mean() > 0.3``), which normal noise may not show."""
    gen = torch.Generator().manual_seed(1)
    return tuple(torch.rand(t.shape, generator=gen).to(t.device, t.dtype)
                 if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in inputs)


def _continued(walk: Walk, ignore: set[str], whole: dict[str, str], follow_sizes: bool, output_transform,
               inputs: tuple, training: bool) -> Walk:
    """A walk going on with ``walk``'s graph on another forward; ``walk`` itself where that
    forward does not run (a detector needs targets in training mode)."""
    try:
        second = Walk(walk.model, ignore, whole, walk, follow_sizes, output_transform)
        second.run(inputs, training=training)
        return second
    except GraphError:
        return walk


class Walk:
    """The channel maps of the forward's tensors, and the graph they build: what the handlers
    read and write (``get``, ``set``, ``fresh``, ``opaque``, the graph ``g``, the module
    running ``where()``). ``after``: a walk whose eval-mode forward this one continues in
    training mode (the same graph)."""

    def __init__(self, model: nn.Module, ignore: set[str], whole: set[str], after: Walk | None = None,
                 follow_sizes: bool = True, output_transform=None):
        self.model, self.ignore, self.keep_whole = model, ignore, whole
        self.follow_sizes, self.pick = follow_sizes, picker(output_transform)
        self.transformed = output_transform is not None
        self.modules = dict(model.named_modules())
        self.traced = Traced(ChannelGraph(model)) if after is None else after.traced.copy()
        self.g = self.traced.graph  # the channel algebra, which the handlers build
        self.inputs, self.params = Inputs(self.get), Params(model)  # the other listeners (flow.py)
        self.maps: dict[int, tuple[torch.Tensor, Map]] = {}  # id -> (tensor kept alive, map)
        self.storage: dict[int, set[int]] = defaultdict(set)  # memory -> ids of tracked tensors
        self.stack: list[str] = []
        self.whole_at_leave: dict[str, tuple] = {}  # module -> (why, width) its inputs are kept
        self.seen: set[str] = set(after.seen) if after else set()
        self.entered: set[str] = set(after.entered) if after else set()  # modules whose forward ran
        self.made = dict(after.made) if after else {}  # layer -> (its output space, its first input)
        self.input_maps: list[Map | None] = list(after.input_maps) if after else []
        self.calls = calls()  # op name -> the layer kind whose rule is called through it
        self.entry: dict[str, torch.Tensor | None] = {}  # module -> the first tensor it was given
        self.baking: dict[str, torch.Tensor] = {}  # layer -> its call with a weight it computed
        self.read: dict[tuple[str, int], Map] = {}  # (module, width) -> the last map whose shape it read

    def run(self, inputs: tuple, training: bool) -> None:
        """Follow one forward (``capture``), from the inputs' channels to the outputs'."""
        images = [t for t in inputs if isinstance(t, torch.Tensor) and t.dim() >= 2]
        for t in inputs:  # a timestep (N,), a scalar: no channels, what it becomes is followed as values
            if isinstance(t, torch.Tensor) and t.dim() < 2:
                self.inputs.given(t)
        for i, t in enumerate(images):
            if len(self.input_maps) <= i:
                space = self.g.new_space(t.shape[1], f"input {i} of the model" if i else "the input image")
                self.input_maps.append(Map([Seg(space, 0, t.shape[1], False)]))
            self.set(t, self.input_maps[i])
        try:
            with compared_widths(self.model, self.traced.coverage.compared):
                out = capture(self.model, inputs, [self.inputs, self, self.params], training,
                              leaf=lambda m: module_kind(m) is not None)
        except CaptureError as e:
            raise GraphError(str(e)) from None
        self.traced.coverage.value_reads += self.inputs.reads
        picked = self.pick(out)
        inside = picked.values() if isinstance(picked, dict) else \
            picked if isinstance(picked, (tuple, list)) else ()
        if any(isinstance(v, Iterator) for v in (picked, *inside)):
            raise GraphError(f"{type(self.model).__name__}'s forward returns an iterator (a generator): its "
                             "outputs, whose channels must stay, cannot be read before they are used; return "
                             "a tensor, a tuple, a list or a dict")
        if self.transformed and not any(self.get(t) is not None for t in leaves(picked)):
            # nothing of the output would be pinned: the network's own output would lose channels
            got = "a tensor the forward did not compute" if isinstance(picked, torch.Tensor) \
                else type(picked).__name__
            raise SlimmingError(f"output_transform returned {got}, nothing of the model's output: it "
                                "picks the outputs whose channels must stay (lambda out: out[0]) and returns "
                                "them as they are", param="output_transform")
        for t in leaves(picked):
            self.pin_tensor(t, "the model's output")

    # ------------------------------------------------------------------ what ran (capture.Listener)

    def enter(self, name: str, m: nn.Module, args: tuple) -> None:
        self.stack.append(name)
        self.entered.add(name)
        self.entry[name] = next(iter(tensors(args)), None)
        if name in self.keep_whole:
            for t in tensors(args):
                self.pin_tensor(t, f"{name} {self.keep_whole[name]}")

    def leave(self, name: str, m: nn.Module, args: tuple, out) -> None:
        kind = module_kind(m)
        if kind is not None:
            try:
                whole_layer(self, name, m, kind, args, out)
            except GraphError:
                raise
            except Exception as e:  # noqa: BLE001 (a layer its rule does not fit: kept, not followed)
                self.opaque(type(m).__name__, f"a layer its rule does not fit: {first_line(e, 80)}",
                            [x for x in map(self.get, tensors(args)) if x is not None], out)
        if name in self.whole_at_leave:  # it reshaped by a size the cut cannot set (reshape.py)
            why, size = self.whole_at_leave[name]
            for t in tensors(args):
                x = self.get(t)
                if x is not None and size in (None, x.channels):
                    pin_heads(self.g, x, why)
        if name in self.ignore:  # what it makes; not its inputs, where it passes them out as they are
            passed = {id(t) for t in tensors(args)}
            for t in tensors(out):
                if id(t) not in passed:
                    self.pin_tensor(t, self.why_kept(name))
        for side, values in (("in", args), ("out", out)):
            for t in tensors(values):
                m_ = self.get(t)
                if m_ is not None:
                    self.traced.widths.borders.setdefault(name, []).append(m_)
                    self.traced.widths.sides.setdefault((name, side), []).append(m_)
        if isinstance(m, nn.MultiheadAttention):  # torch's own forward (a cross-attention) uses
            self.seen.add(f"{name}.out_proj" if name else "out_proj")  # out_proj without calling it
        if name in self.baking:
            baked_left(self, name, out)
        if self.stack and self.stack[-1] == name:
            self.stack.pop()

    def call(self, c: Call) -> None:
        """One call of the forward: its handler, then what an in-place write did to aliases
        (what the inputs became and where parameters went: the other listeners, ``flow``)."""
        op = op_name(c.func)
        if op in META_OPS:
            return self.read_shape(op, c.args, c.out)
        args, kwargs, out = c.args, c.kwargs, c.out
        target = args[0] if args and isinstance(args[0], torch.Tensor) else None
        writes = target is not None and in_place(c.func, args, kwargs, out)
        before = self.get(target) if writes else None
        given = tensors(list(args) + list(kwargs.values()))
        inputs = [(t, self.get(t)) for t in given]
        inputs = [(t, m) for t, m in inputs if m is not None]
        embedding = _embedding(self, args[0]) if not inputs and op in EMBEDDING_OPS and args else None
        if embedding is not None:  # a position embedding reshaped or resampled before it is added
            inputs = [(args[0], embedding)]
        try:
            self.follow(Step(op, c.func, args, kwargs, out, inputs))
        except GraphError:
            raise
        except Exception as e:  # noqa: BLE001 (arguments no handler here expected: kept, not followed)
            self.opaque(op, f"arguments it does not expect: {first_line(e, 80)}", [m for _, m in inputs], out)
        if writes:
            _written(self, op, target, before, bool(inputs))

    def read_shape(self, op: str, args: tuple, out):
        """A module's code read a tracked tensor's shape (``key.shape``, ``x.size(1)``): the width
        it read may size a view of other channels (``reshape.reshape``'s heads). What the code
        gets has that width as a ``ReadWidth`` (the shape, else None: as it was), so that a
        reshape given it later knows whose width it is."""
        x = self.get(args[0]) if op in ("shape", "size") and args and self.stack else None
        dim = args[1] if op == "size" and len(args) > 1 else None
        if x is None or not (dim is None or isinstance(dim, int) and dim % args[0].dim() == x.dim):
            return None
        self.read[self.stack[-1], x.channels] = x
        if isinstance(out, torch.Size) and x.dim < len(out) and type(out[x.dim]) is int:
            return torch.Size([*out[:x.dim], ReadWidth(out[x.dim], x), *out[x.dim + 1:]])
        return ReadWidth(out, x) if type(out) is int else None

    def follow(self, s: Step) -> None:
        """The handler of one op (``DISPATCH``, or a layer's rule by ``calls``)."""
        op = OP_ALIASES.get(s.op, s.op)  # an op of your own, followed as the known one it is like
        first = s.args[0] if s.args else None
        if not s.inputs and op in self.calls and RULES[self.calls[op]].makes and self.inputs.became(first):
            return layer(self, s._replace(op=op))  # on what an input without channels became (a timestep)
        if not s.inputs:
            if op in self.calls:  # a layer on what carries no channels (an attention map): it ran
                name = owned(self, s, RULES[self.calls[op]].positions)[1]
                if name is not None:
                    self.traced.widths.headless.append(name)
            if isinstance(s.out, torch.Tensor) and s.op != "setitem":
                self.set(s.out, None)  # a fresh tensor from constants, or one overwritten by them
            return
        handler = layer if op in self.calls else DISPATCH.get(op)
        if handler is None:
            return self.opaque(op, "an op it does not know", [m for _, m in s.inputs], s.out)
        handler(self, s._replace(op=op))

    # ------------------------------------------------------------------ the maps

    def layer_names(self) -> list[str]:
        return [name for name, m in self.modules.items() if is_layer(m)]

    def unseen(self) -> list[str]:
        return [n for n in self.layer_names() if n not in self.seen]

    def finish(self) -> None:
        pin_shared(self.g)
        coverage = self.traced.coverage
        _keep_compared(self.g, self.traced.widths, coverage.compared)
        coverage.unseen = self.unseen()
        attention = nn.MultiheadAttention  # (its out_proj is run through its tensors by torch's forward)
        coverage.by_weight = [n for n in self.layer_names() if n in self.seen and n not in self.entered
                              and not isinstance(self.modules.get(n.rpartition(".")[0]), attention)]
        if coverage.unseen:
            names = ", ".join(coverage.unseen[:5]) + (", ..." if len(coverage.unseen) > 5 else "")
            warnings.warn(f"{len(coverage.unseen)} layer(s) did not run on the example input (in eval "
                          f"or training mode) and keep all their channels: {names} (the trace follows "
                          "the path the example takes)", stacklevel=3)
        summary = kept_summary(self.g)
        if summary:
            warnings.warn(f"slimming kept channels it cannot follow one by one (the rest is cut "
                          f"exactly): {summary}; nothing to do unless you want them cut: an op of your "
                          "own that acts channel by channel is slimming.register_op(name, like=...), "
                          "the rest is in docs/networks.md ('Decided at the end')", stacklevel=3)
        self.maps.clear()
        self.storage.clear()
        self.entry.clear()
        self.inputs, self.params = Inputs(self.get), Params(self.model)  # what they held, freed

    def get(self, t) -> Map | None:
        entry = self.maps.get(id(t)) if isinstance(t, torch.Tensor) else None
        return entry[1] if entry is not None and entry[0] is t else None

    def set(self, t: torch.Tensor, m: Map | None) -> None:
        if not isinstance(t, torch.Tensor):
            return
        if m is not None and (m.dim >= t.dim() or t.shape[m.dim] != m.channels * m.factor):
            # a rule's map that does not fit its tensor: those channels are kept, and the
            # tensor followed as channels of its own (never a cut on a guess)
            self.g.pin(m, f"{self.where()}: channels the trace lost track of")
            m = Map([Seg(self.g.new_space(t.shape[1], "lost track"), 0, t.shape[1], False)]) \
                if t.dim() >= 2 else None
        ptr = _memory(t)
        if m is None:
            if self.maps.pop(id(t), None) is not None and ptr:
                self.storage[ptr].discard(id(t))
        else:
            self.maps[id(t)] = (t, m)
            if ptr:
                self.storage[ptr].add(id(t))
            if self.stack:
                self.traced.widths.frames.setdefault(self.stack[-1], []).append(m)

    def fresh(self, t: torch.Tensor, why: str, dim: int = 1) -> None:
        """``t`` gets channels of its own along ``dim``, kept whole (None for a tensor without
        channels): what the trace cannot map channel by channel is still followed, so that the
        layers after it are known and cut."""
        if isinstance(t, torch.Tensor):
            dim = dim if 0 < dim < t.dim() else 1
            self.set(t, Map([Seg(self.g.new_space(t.shape[dim], why), 0, t.shape[dim], False)], dim=dim)
                     if t.dim() >= 2 else None)

    def where(self) -> str:
        return self.stack[-1] if self.stack and self.stack[-1] else "the model's forward"

    def running(self) -> str:
        return self.stack[-1] if self.stack else ""

    def pin_tensor(self, t: torch.Tensor, why: str) -> None:
        m = self.get(t)
        if m is not None:
            self.g.pin(m, why)

    def sized(self, sizes: list[int]) -> bool:
        """Whether every size is an integer attribute of the module whose forward is running (so
        that the cut can set it), when sizes are followed at all."""
        if not self.follow_sizes or not self.stack:
            return False
        held = {int(v) for v in vars(self.modules[self.stack[-1]]).values() if type(v) in INTS}
        return set(sizes) <= held

    def in_ignored(self) -> bool:
        return any(name in self.ignore for name in self.stack)

    def why_kept(self, name: str) -> str:
        """Why ``name``'s channels are kept, where it or a module running around it is in
        ``ignore``: the user's ``ignore``, or the block kept whole around it (``keep_whole``, or a
        cut refused by the check), as the message says it."""
        for n in (name, *reversed(self.stack)):
            if n in self.keep_whole:
                reason = self.keep_whole[n]
                if reason == "is in keep_whole" or n == name:
                    return f"{name} {reason}"
                return f"{name}: {n} {reason}"
            if n in self.ignore:
                break
        return f"{name} is in ignore"

    def opaque(self, op: str, what: str, inputs: list[Map], out, dim: int | None = None) -> None:
        """An op the graph cannot follow channel by channel: every channel it reads is kept
        (its outputs are then what they were), and each output gets channels of its own (along
        ``dim``; by default where its inputs have theirs), kept whole. Recorded for the warning
        that ``finish`` gives."""
        if dim is None:
            dims = {m.dim for m in inputs}
            dim = dims.pop() if len(dims) == 1 else 1
        why = self.keep(op, what, inputs)
        for t in tensors(out):
            self.fresh(t, why, dim)

    def keep(self, op: str, what: str, inputs: list[Map]) -> str:
        """Every channel of ``inputs`` kept, because ``op`` reads them as ``what``; recorded for
        the warning. Returns the reason."""
        where = self.where()
        why = f"{where}: {op} ({what})"
        for m in inputs:
            self.g.pin(m, why)
        kind = type(self.modules.get(where, self.model)).__name__
        self.g.kept.append(Kept(kind, where, op, what, list(inputs)))
        return why

    def channel_tensor(self, t: torch.Tensor, c: int, dim: int | None = None) -> tuple[str, str, int] | None:
        """``Params.channel_tensor``; inside a module in ``ignore``, None (kept)."""
        return None if self.in_ignored() else self.params.channel_tensor(t, c, dim)

    def scale(self, module: str, attr: str, dim: int, x: Map) -> None:
        """A per-channel parameter of ``module`` (a layer scale) applied to channels ``x``: cut
        with them (a second use reads the same channels: tied)."""
        self.seen.add(module)
        if self.again(f"{module}#{attr}", x) is None:
            self.g.uses.append(Use(module, "scale", x, {"weight": attr}, dim))

    def again(self, name: str, x: Map) -> int | None:
        """A layer called more than once reads the same channels each time: its inputs are tied
        to its first call's. Returns its output space when it made one before."""
        first = self.made.get(name)
        if first is None:
            self.made[name] = (None, x)
            return None
        self.g.tie(first[1], x, f"{name} is called on channels it cannot pair with its first call's")
        return first[0]


def _embedding(w: Walk, t) -> Map | None:
    """A position embedding, a parameter (1, L, C) or (1, C, H, W), that the forward slices,
    reshapes or resamples before adding it to the tokens (timm's ``dynamic_img_size``,
    Hugging Face's DPT at another grid): its channels (C) followed from here, as the
    tokens' once they meet, and the parameter cut along them (``scale``). None for
    anything else, or inside a module kept (``ignore``)."""
    owner = w.params.owner.get(id(t)) if isinstance(t, nn.Parameter) else None
    if owner is None or t.dim() not in (3, 4) or t.shape[0] != 1 or w.in_ignored():
        return None
    dim = 2 if t.dim() == 3 else 1
    m = Map([Seg(w.g.new_space(t.shape[dim]), 0, t.shape[dim], False)], dim=dim)
    w.scale(*owner, dim, m)
    w.set(t, m)
    return m


def _keep_compared(g, widths, found: list[tuple[str, str, int]]) -> None:
    """The channels of every width an integer attribute holds that the forward compared as a
    number (``flow.compared_widths``): kept, in one warning, since a cut that lowered it would
    change what the forward decides (``if x.shape[-1] < self.c``) at every input size."""
    kept = []
    for name, attr, value in found:
        maps = [m for m in (*widths.frames.get(name, ()), *widths.borders.get(name, ()))
                if m.factor == 1 and m.channels == value]
        for m in maps:
            g.pin(m, f"{name or 'the model'}.{attr} is compared as a number by the forward")
        if maps:
            kept.append(f"{name}.{attr}" if name else attr)
    if kept:
        warnings.warn(f"slimming kept the channels of {len(kept)} width(s) the forward compares as "
                      f"numbers (a cut would change what it decides): {', '.join(kept[:6])}",
                      stacklevel=4)


def _written(w: Walk, op: str, t: torch.Tensor, before: Map | None, tracked: bool) -> None:
    """After ``op`` wrote into ``t``: where its channels changed, every other tensor sharing
    its memory (the tensor it is a view of, other views, ``detach()`` aliases) changed too;
    their channels are kept. A tracked tensor written into an untracked one (a detection
    transform's ``copy_`` into a fresh batch) gives it, and what it is a view of, channels
    of their own."""
    after = w.get(t)
    if after == before and (after is not None or not tracked):
        return
    why = f"{w.where()}: {op} writes in place through a view or an alias"
    if after is None and tracked:
        w.fresh(t, why)
    for i in list(w.storage.get(_memory(t), ())):
        other = w.maps.get(i)
        if other is not None and other[0] is not t:
            w.g.pin(other[1], why)
            w.set(other[0], other[1].with_gate(False))
    base = t._base
    if base is not None and w.get(base) is None and base.dim() >= 2:
        w.fresh(base, why)


def _memory(t: torch.Tensor) -> int:
    """The address of ``t``'s memory (0 when it has none to share)."""
    try:
        return t.untyped_storage().data_ptr()
    except Exception:  # noqa: BLE001 (tensor subclasses without storage)
        return 0
