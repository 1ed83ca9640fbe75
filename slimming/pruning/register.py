"""What the trace follows, and how to teach it your own code: the two registrations, in one
place, both refusing bad input with one ``SlimmingError`` that names the parameter, both giving a
``Registration`` handle (``.remove()``, or a ``with`` block) that undoes exactly what it did,
whatever the order the handles are removed in.

``register_layer``: a module type followed whole, as one layer cut by a ``LayerRule``. Its rule
goes in ``slimming.layers.rules.RULES`` beside the built-in ones, which is where it is defined
(``slimming.io`` reads that table too, rebuilding a pruned file's registered layers, and sits
below ``pruning``); it is given here, beside its twin, as ``slimming.register_layer``.

``register_op``: a torch op the trace does not know (a ``torch.library`` custom op), followed as
one it knows. The ops it knows are ``DISPATCH`` (op name -> its handler in ``ops``, ``reshape``,
``index``) and the functions the layer rules call (``calls()``: ``F.conv2d`` -> ``conv``).
"""

from __future__ import annotations

from ..errors import SlimmingError
from ..layers.rules import RULES, Registration, register_layer
from . import index, ops, reshape
from .ops import (
    CONSTANT_OPS,
    ELEMENTWISE,
    NORM_OPS,
    PASS_OPS,
    PRODUCT_OPS,
    REDUCE_OPS,
    RESHAPE_OPS,
    SPLIT_OPS,
    SUM_OPS,
    VALUE_OPS,
    ZERO_OPS,
    Handler,
)

__all__ = ["DISPATCH", "OP_ALIASES", "calls", "register_layer", "register_op"]


def _dispatch() -> dict[str, Handler]:
    """op name -> its handler; a later line wins where the tables share a name. The layers'
    functions are not here: a rule's ``calls`` name them (``calls()``)."""
    table: dict[str, Handler] = {}
    for names, handler in ((ZERO_OPS | PASS_OPS | ELEMENTWISE, ops.elementwise), (VALUE_OPS, ops.value),
                           (SPLIT_OPS, ops.split), (REDUCE_OPS, ops.reduce), ({"max", "min"}, ops.extremum),
                           (RESHAPE_OPS, reshape.reshape), (SUM_OPS | PRODUCT_OPS | {"div"}, ops.combine),
                           (NORM_OPS, ops.norm), ({"prelu"}, ops.prelu), (CONSTANT_OPS, ops.constant)):
        table.update(dict.fromkeys(names, handler))
    table.update(roll=ops.roll, cat=ops.cat, stack=ops.stack, matmul=ops.matmul, bmm=ops.matmul,
                 mm=ops.matmul, softmax=ops.softmax, log_softmax=ops.softmax,
                 scaled_dot_product_attention=ops.scaled_dot_product_attention,
                 multi_head_attention_forward=ops.multi_head_attention, zeros_like=ops.zeros_like,
                 ones_like=ops.ones_like, empty_like=ops.ones_like, full_like=ops.ones_like,
                 rand_like=ops.ones_like, randn_like=ops.ones_like, getitem=index.getitem,
                 setitem=index.setitem)
    return table


def calls() -> dict[str, str]:
    """op name -> the layer kind whose rule is called through it (``F.conv2d``: ``conv``), the
    registered rules' too."""
    return {op: kind for kind, rule in RULES.items() for op in rule.calls}


DISPATCH: dict[str, Handler] = _dispatch()
OP_ALIASES: dict[str, str] = {}  # an op's name -> the known op it is followed as (register_op)


def register_op(name: str, like: str) -> Registration:
    """Follow the torch op ``name`` (a ``torch.library`` custom op's name, ``"swish"`` for
    ``mylib::swish``, or any torch function the trace does not know) as the known op ``like``
    (``"silu"``: element-wise, a zero stays zero if it does on a zero; ``"add"``: a sum that ties
    its inputs; ``"cat"``, ``"view"``, ...): without it, an op the trace does not know keeps every
    channel it reads. Returns a handle: ``.remove()`` or a ``with`` block undoes it. Registering
    the same name again follows it as the newer ``like`` until that handle is removed."""
    known = calls()
    if not isinstance(name, str) or not name or name in DISPATCH or name in known:
        raise SlimmingError(f"register_op takes the name of an op the trace does not know, not {name!r}",
                            param="name")
    if not isinstance(like, str) or (like not in DISPATCH and like not in known):
        raise SlimmingError(f"register_op: {like!r} is not an op the trace knows (like='silu', 'add', "
                            "'cat', 'view', ...)", param="like")
    return Registration(name, [(OP_ALIASES, name, like)])
