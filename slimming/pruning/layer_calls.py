"""How the trace follows a layer, by the rule of its kind (``slimming.layers.rules.RULES``): one
handler for every rule known by its call (``layer``: a torch function of the rule's ``calls``
given one module's tensors, at the rule's ``positions``), one for every module followed whole
(``whole_layer``: a frozen BatchNorm, an RMSNorm, a gate, a registered kind). A layer that
*makes* channels (a convolution, a linear layer) gives them a space of its own; one that
*carries* them (a BatchNorm, a GroupNorm, a LayerNorm, a depthwise convolution) passes its
input's on and is cut with them. What does not fit its rule is kept (``Walk.opaque``).

A layer may convolve with a weight its forward computes from its own parameters alone
(weight standardisation: timm's ``StdConv2d``): ``computed`` takes it as that layer's, the
weight recorded (``Baked.computed``), and the cut bakes it into the plain layer it ran
(``slimming.layers.baked``), where the layer did nothing but (pad and) convolve with it.

A layer's bias may be made row by row from parameters in its forward (``torch.cat((self.q_bias,
self.k_bias, self.v_bias))`` in EVA and BEiT, ``self.qkv.bias.clone()`` with the keys' third
zeroed in torchvision's Swin-v2): ``flow.Params.rows_of`` tells which parameter each row is,
and those parameters are cut with the layer's output channels, row for row (``Walk.scale``).
"""

from __future__ import annotations

import torch
from torch import nn

from ..layers.baked import same_pads
from ..layers.rules import RULES, is_layer, layer_kind
from .flow import Piece
from .graph import Map, Seg, Side, Use
from .ops import Step, Walk, arg, tensors


def layer(w: Walk, s: Step) -> None:
    """A call of a layer's function (``F.conv2d``, ``F.batch_norm``, ...) with its tensors,
    every one of them a parameter or buffer of one module (whose tensors of those names are then
    cut); the rule is the one whose ``calls`` name the op."""
    kind = w.calls[s.op]
    rule = RULES[kind]
    x_t = s.args[0] if s.args else s.kwargs.get("input")
    x = w.get(x_t)
    rows = {role: p for role, i in rule.positions if rule.makes.get(role) == 0
            and id(t := arg(s.args, s.kwargs, i, role)) not in w.params.owner and (p := w.params.rows_of(t))}
    given, name, attrs = owned(w, s, [(role, i) for role, i in rule.positions if role not in rows])
    if attrs is None and rule.makes:  # a weight it computed (standardised): its own, baked at the cut
        name, attrs = computed(w, s, kind, given, x_t) or (name, attrs)
    if not given:  # a norm without tensors (affine=False): the module it runs in, if of its kind
        attrs = {}
        if rule.carries and w.stack and layer_kind(w.modules[w.stack[-1]]) == kind:
            name = w.stack[-1]
    if w.stack and (rule.carries or (name is None and is_layer(w.modules.get(w.stack[-1])))):
        # a norm module without tensors ran too, and so did a layer whose forward computes the
        # tensors it calls with (a QAT ConvBn2d's fake-quantised, BatchNorm-scaled weight)
        w.seen.add(w.stack[-1])
    known = rule.makes and name is not None and attrs is not None
    conditions = known and (x is None and w.inputs.became(x_t) or _conditioning(w, x))
    if x is None and conditions:
        # what an input without channels became (a timestep's embedding): its columns are kept,
        # the rows it makes are channels of its own, cut where they meet others (added onto a map)
        reads = x_t.shape[-1] if rule.last else x_t.shape[1]
        x = Map([Seg(w.g.new_space(reads, f"{name}: reads an input without channels"), 0, reads, False)],
                dim=x_t.dim() - 1 if rule.last else 1)
    if x is None:  # a layer of something made from constants: its outputs are kept
        return w.fresh(s.out, f"{name or s.op}: reads no tracked channels")
    why = _misfit(w, s, kind, x_t, x, name, attrs)
    if why and rule.makes and attrs is not None and name is not None:
        # it reads what it cannot follow (kept) but still makes channels of its own: an
        # attention's projection after its heads were merged by a reshape the trace keeps
        why = w.keep(s.op, why, [m for _, m in s.inputs])
        reads = x_t.shape[-1] if rule.last else x_t.shape[1]
        x = Map([Seg(w.g.new_space(reads, why), 0, reads, False)], dim=x_t.dim() - 1 if rule.last else 1)
    elif why:
        return w.opaque(s.op, why, [m for _, m in s.inputs], s.out)
    for t, m in s.inputs:  # other tracked inputs (a deformable convolution's offsets): kept
        if t is not x_t:
            w.g.pin(m, f"{name}: read by a {s.op} as other than its channels")
    ignored = name in w.ignore or w.in_ignored()
    if rule.makes:
        own = {role: p[0].attr for role, p in rows.items() if len(p) == 1 and p[0].module == name}
        attrs.update(own)  # its own bias, cloned (then partly zeroed): cut as its own
        _makes(w, s, kind, x_t, x, name, ignored, attrs)
        if conditions and not ignored and (made := w.get(s.out)) is not None:
            # a scale or shift of the channels it meets (FiLM, AdaGN's scale_shift): a cut
            # channel's rows go with it, zeroed in the reference as its gamma and beta are
            w.set(s.out, made.with_gate(True))
            w.traced.conditioning.append(name)
        return _rows_cut(w, w.get(s.out), [p for role, p in rows.items() if role not in own])
    groups = arg(s.args, s.kwargs, 1, "num_groups") if kind == "group_norm" else 1
    if groups > 1:
        w.g.whole_blocks(x, groups)
    elif kind == "group_norm" and groups == 1 and x.channels > 1:  # timm's GroupNorm1 (PoolFormer's)
        w.g.pin(x, f"{name}: a group_norm of one group normalises each channel by all of them")
    if ignored and rule.scores:
        w.g.pin(x, w.why_kept(name))
    if name is not None:
        w.again(name, x)
        w.g.uses.append(Use(name, kind, x, attrs))
    bias = given.get("bias")
    moves = rule.shifts or (bias is not None and bool(bias.ne(0).any()))
    w.set(s.out, x.with_gate(True if rule.gated and "weight" in attrs else False if moves else None))


def computed(w: Walk, s: Step, kind: str, given: dict, x_t) -> tuple[str, dict] | None:
    """(layer, attrs) where the module running (of this call's kind) calls it with a weight of
    its own weight's shape that its forward computed from parameters alone, on the input it was
    given (or that input padded as TensorFlow's SAME does, where it says ``same_pad``), its
    other tensors its own: that weight is recorded (``Baked.computed``) and the call followed as
    the layer's; ``baked_left`` then checks that the layer returned what the call gave."""
    name = w.stack[-1] if w.stack else None
    m = w.modules.get(name)
    weight = given.get("weight")
    if m is None or layer_kind(m) != kind or not isinstance(getattr(m, "weight", None), nn.Parameter) \
            or weight is None or not w.params.alone(weight) or weight.shape != m.weight.shape:
        return None
    others = {role: w.params.owner.get(id(t)) for role, t in given.items() if role != "weight"}
    if any(o is None or o[0] != name for o in others.values()):
        return None
    if x_t is not w.entry.get(name) and not _same_padded(w, m, name, x_t):
        return None
    w.seen.add(name)
    w.traced.baked.computed[name] = weight.detach()
    w.baking[name] = s.out
    return name, {"weight": "weight", **{role: o[1] for role, o in others.items()}}


def _same_padded(w: Walk, m: nn.Module, name: str, x_t) -> bool:
    """Whether ``x_t`` is ``m``'s input padded with zeros as TensorFlow's SAME padding does (and
    ``m`` says so: timm's ``same_pad``), which the baked layer does again (``Conv2dSame``)."""
    entry, made = w.entry.get(name), w.params.pads.get(id(x_t))
    if getattr(m, "same_pad", False) is not True or made is None or made.out is not x_t \
            or made.of is not entry or entry is None or entry.dim() != 4 or made.mode != "constant" \
            or made.value not in (None, 0, 0.0):
        return False
    (top, bottom), (left, right) = (same_pads(n, k, st, d) for n, k, st, d in
                                    zip(entry.shape[-2:], m.kernel_size, m.stride, m.dilation))
    return list(made.pad) == [left, right, top, bottom]


def baked_left(w: Walk, name: str, out) -> None:
    """A layer that convolved with a weight it computed (``computed``) returned: unless what it
    returned is that call's output (a layer doing more after it), nothing of it is cut."""
    made = w.baking.pop(name)
    if out is made:
        return
    w.traced.baked.computed.pop(name, None)
    w.traced.baked.unbaked.append(name)
    maps = [m for m in map(w.get, (made, w.entry.get(name))) if m is not None]
    w.keep(type(w.modules[name]).__name__, "a layer computing its weight that does more than convolve "
           "with it", maps)


def _rows_cut(w: Walk, out: Map | None, rows: list[tuple[Piece, ...]]) -> None:
    """The parameters a layer's tensor was made of row by row (``Params.rows_of``), cut with the
    output channels ``out`` their rows are; a constant's rows need no cut."""
    for pieces in rows:
        start = 0
        for p in pieces:
            if p.module is not None and out is not None:
                w.scale(p.module, p.attr, 0, out.slice(start, start + p.length))
            start += p.length


def _misfit(w: Walk, s: Step, kind: str, x_t: torch.Tensor, x: Map, name: str | None, attrs) -> str:
    """Why this call does not fit its rule (kept whole), or ''."""
    rule = RULES[kind]
    if attrs is None or (rule.makes and name is None):
        return "a layer whose tensors are not one module's parameters"
    if x.dim != (x_t.dim() - 1 if rule.last else 1):
        return f"a {s.op} over other than its input's channels"
    if rule.makes:
        return "" if x.factor == 1 or (rule.last and x_t.dim() == 2) else \
            f"a {s.op} of a flattened tensor"
    out = s.out
    if x.factor != 1 or len(s.inputs) > 1 or not isinstance(out, torch.Tensor) or out.dim() < 2:
        return f"a {s.op} of other than one module's channels"
    if s.op == "group_norm":
        groups = arg(s.args, s.kwargs, 1, "num_groups")
        if not isinstance(groups, int) or x.channels % groups:
            return "a group_norm of other than whole groups"
    if rule.normalises and (name is None or "weight" not in attrs or out.shape != x_t.shape
                            or len(_shape(s)) != 1 or name in w.ignore or w.in_ignored()
                            or layer_kind(w.modules.get(name)) != kind):
        # kept, not followed: a norm over more than the channels, or without a scale of its
        # own, normalises each channel by statistics of the others that no factor scores
        return "a normalisation over the channels: cutting one changes the others"
    return ""


def _shape(s: Step) -> tuple:
    shape = arg(s.args, s.kwargs, 1, "normalized_shape")
    return (shape,) if isinstance(shape, int) else tuple(shape)


def _makes(w: Walk, s: Step, kind: str, x_t, x: Map, name: str, ignored: bool, attrs) -> None:
    """A convolution or linear layer: new channels; a depthwise convolution carries its input's;
    a grouped one keeps equal counts in every group."""
    out = s.out
    if RULES[kind].last:  # reads the last dim: (N, features), or tokens (N, L, C), channels-last
        return produce(w, name, kind, x, out.shape[-1], ignored, out, attrs, dim=out.dim() - 1)
    groups = arg(s.args, s.kwargs, 6, "groups", 1) if RULES[kind].grouped or kind == "convt" else 1
    cin, cout = x_t.shape[1], out.shape[1]
    if kind == "convt":
        if groups != 1:
            w.g.pin(x, f"the grouped transposed convolution {name}")
        return produce(w, name, kind, x, cout, ignored or groups != 1, out, attrs)
    if groups == 1:
        return produce(w, name, kind, x, cout, ignored, out, attrs)
    if groups == cin == cout and not ignored:  # depthwise: channel c -> channel c
        w.again(name, x)
        w.g.uses.append(Use(name, "depthwise", x, attrs))
        if w.stack and w.stack[-1] == name:  # F.conv2d(x, self.filt, groups=C) in a module:
            w.traced.widths.group_counts.setdefault(name, []).append((groups, x))  # its groups follow x
        return w.set(out, x.with_gate(None if "bias" not in attrs else False))
    # grouped: every group keeps the same number of input and of output channels
    w.g.equal_blocks(x, groups, "groups")
    space = produce(w, name, kind, x, cout, ignored, out, attrs, groups)
    w.g.equal_blocks(Map([Seg(space, 0, cout, False)]), groups, "groups")


def _conditioning(w: Walk, x: Map | None) -> bool:
    """Whether ``x`` is only channels a layer made of what an input without channels became
    (the MLP over a timestep's embedding: ``Traced.conditioning``)."""
    if x is None or not w.traced.conditioning:  # every layer call asks: most have none to look at
        return False
    made = {w.made[n][0] for n in w.traced.conditioning if n in w.made}
    return all(seg.space in made for seg in x.segs)


def owned(w: Walk, s: Step, positions) -> tuple[dict, str | None, dict | None]:
    """The tensors a layer op was called with, by part ({"weight": ..., ...}), the module
    they belong to (marked as run) and which of its attributes each is; attrs None when
    they are not all one module's parameters or buffers."""
    given = {role: arg(s.args, s.kwargs, i, role) for role, i in positions}
    given = {role: t for role, t in given.items() if isinstance(t, torch.Tensor)}
    owners = {role: w.params.owner.get(id(t)) for role, t in given.items()}
    names = {o[0] for o in owners.values() if o is not None}
    name = next(iter(names)) if len(names) == 1 else None
    if name is not None:
        w.seen.add(name)
    attrs = {role: o[1] for role, o in owners.items()} if name and None not in owners.values() else None
    return given, name, attrs


def produce(w: Walk, name: str, kind: str, x: Map, width: int, ignored: bool, out, attrs,
            groups: int = 1, dim: int = 1) -> int:
    """A layer reading ``x`` and making ``width`` channels of a space of its own (kept whole
    when ``ignored``; the channels it reads too, inside a module in ``keep_whole``)."""
    why = w.why_kept(name) if ignored else ""
    whole = next((n for n in (*w.stack, name) if n in w.keep_whole), None)
    if whole is not None:
        w.g.pin(x, f"{name} is in keep_whole" if whole == name or w.keep_whole[whole] == "is in keep_whole"
                else f"{name}: {whole} {w.keep_whole[whole]}")
    space = w.again(name, x)
    if space is None:
        space = w.g.new_space(width, why)
        w.made[name] = (space, x)
        w.g.uses.append(Use(name, kind, Map([Seg(space, 0, width, False)]), attrs, groups, Side.OUT))
    w.g.uses.append(Use(name, kind, x, attrs, groups, Side.IN))
    w.set(out, Map([Seg(space, 0, width, False)], dim=dim))
    return space


def whole_layer(w: Walk, name: str, m: nn.Module, kind: str, args, out) -> None:
    """A module followed whole by the rule of its kind (a frozen BatchNorm, a registered
    layer): it reads its first input's channels and makes (or carries) its output's; its
    other inputs are kept."""
    w.seen.add(name)
    rule = RULES[kind]
    ins = [t for t in tensors(args) if w.get(t) is not None]
    x = w.get(args[0]) if args else None
    for t in ins[1:] if x is not None else ins:
        w.pin_tensor(t, f"{name}: read by a {type(m).__name__} as other than its channels")
    if kind == "head_gate":
        return head_gate(w, name, m, x, out)
    if x is None:
        return w.fresh(out, f"{name}: made from untracked inputs") if isinstance(out, torch.Tensor) else None
    carried = not rule.makes and isinstance(out, torch.Tensor) and out.shape == args[0].shape
    if not isinstance(out, torch.Tensor) or out.dim() < 2 or x.factor != 1 \
            or (x.dim != 1 and not carried):
        return w.opaque(type(m).__name__, "a layer followed whole whose output is not (N, C, ...)", [x], out)
    attrs = {role: role for tensors_ in (rule.reads, rule.makes, rule.carries) for role in tensors_
             if isinstance(getattr(m, role, None), torch.Tensor)}
    ignored = name in w.ignore or w.in_ignored()
    if rule.makes:
        return produce(w, name, kind, x, out.shape[1], ignored, out, attrs)
    if out.shape[x.dim] != x.channels:
        return w.opaque(type(m).__name__, "a layer that carries its channels but changes their number",
                        [x], out)
    if rule.normalises and (x.dim != out.dim() - 1 or "weight" not in attrs
                            or m.weight.shape != (x.channels,)):
        # Kept, not followed: a norm over other than the last dim alone, or without a scale of its
        # own, normalises each channel by statistics of others that no factor scores
        return w.opaque(type(m).__name__, "a normalisation over other than its channels, or "
                        "without a scale of its own", [x], out)
    if ignored:
        w.g.pin(x, w.why_kept(name))
    w.again(name, x)
    w.g.uses.append(Use(name, kind, x, attrs))
    w.set(out, x.with_gate(rule.gated and "weight" in attrs))


def head_gate(w: Walk, name: str, m: nn.Module, x: Map | None, out) -> None:
    """A gate per head (``HeadGate``) scores the heads of the attention whose merged heads
    it scales (``graph.heads_of``); its output's channels are its input's. On anything else
    the heads it would score are kept."""
    count = m.weight.numel()
    found = w.g.heads_of(x) if x is not None else None
    if found is None or found[1] != count:
        space = w.g.new_space(count, f"{name}: a gate per head where the trace found no heads")
    else:
        space = found[0]
        if name in w.ignore or w.in_ignored():
            w.g.pin(Map([Seg(space, 0, count, False)]), w.why_kept(name))
    w.g.uses.append(Use(name, "head_gate", Map([Seg(space, 0, count, True)]), {"weight": "weight"}))
    w.set(out, x)
