"""``capture``: one real forward of a network, told as it runs: every module entered and left,
and every torch function and tensor method called with its real arguments and result. This is
the record the trace's passes read (``slimming.pruning.trace`` follows the channels through
it); it knows nothing of channels, as torch.fx's tracer knows nothing of the interpreters that
read its graph.

Why a ``TorchFunctionMode`` rather than torch.fx or the autograd graph: a real forward follows
any Python the network's authors wrote (loops and lists over ``chunk``, shape checks, layers
picked by index, dict and nested outputs), which torch.fx refuses; every torch function and
tensor method is seen with its real arguments (``dim``, slice bounds, split sizes), which the
autograd graph does not keep, and no graph of gradients is built.

The record is handed to its ``Listener``s call by call, each in turn, not kept: a forward's
tensors are freed as it goes, and a later in-place op cannot change what an earlier call is
seen to have done. Inside a *leaf* module (one followed whole by its rule, as torch.fx's
``is_leaf_module``) the calls are not told. An all-zero example carries no values to follow, so
there a convolution gives zeros of the shape it would give, without its arithmetic (most of a
forward's time).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from ..errors import first_line
from ..utils.modules import hooked

_SHORTCUT = {torch.conv1d, torch.conv2d, torch.conv3d}


class Call(NamedTuple):
    """One torch function or tensor method the forward called, after it ran."""

    func: Callable
    args: tuple
    kwargs: dict
    out: Any


class Listener(Protocol):
    """What reads the record: a module entered (before its forward) and left (after it), with
    its inputs and output, and every call in between (but those inside a leaf module)."""

    def enter(self, name: str, module: nn.Module, args: tuple) -> None: ...

    def leave(self, name: str, module: nn.Module, args: tuple, out: Any) -> None: ...

    def call(self, call: Call) -> Any: ...  # None, or what the call gives the forward instead


class CaptureError(Exception):
    """The model did not run on the inputs: the message says with which shapes, and why."""


def capture(model: nn.Module, inputs: tuple, listeners: Sequence[Listener], training: bool = False,
            leaf: Callable[[nn.Module], bool] = lambda m: False) -> Any:
    """Run ``model(*inputs)`` without gradients in training or eval mode (the caller restores
    the flag), telling each of ``listeners`` what ran, in their order (one analysis each, as
    torch.fx's interpreters each read one graph); returns the output. A training forward's changes
    to buffers (BatchNorm statistics) are undone. An error a listener raises passes as it is;
    one of the model's is a ``CaptureError``."""
    depth = [0]  # > 0 inside a leaf module
    saved = [(b, b.clone()) for b in model.buffers()] if training else []

    def enter(name: str, m: nn.Module):
        is_leaf = leaf(m)

        def hook(module, args):
            for listener in listeners:
                _told(listener.enter, name, module, args)
            depth[0] += is_leaf
        return hook

    def leave(name: str, m: nn.Module):
        is_leaf = leaf(m)

        def hook(module, args, out):
            depth[0] -= is_leaf
            for listener in listeners:
                _told(listener.leave, name, module, args, out)
        return hook

    named = list(model.named_modules())
    try:
        model.train(training)
        try:
            with hooked(pre=[(m, enter(name, m)) for name, m in named],
                        post=[(m, leave(name, m)) for name, m in named]), \
                    torch.no_grad(), _Mode(listeners, depth, blank(inputs)):
                return model(*inputs)
        except _Passed as e:
            raise e.error from None
        except Exception as e:
            shapes = ", ".join(str(tuple(t.shape)) for t in inputs if isinstance(t, torch.Tensor))
            mode = " in training mode" if training else ""
            raise CaptureError(f"{type(model).__name__} does not run{mode} on example_inputs of shape "
                               f"{shapes}: {first_line(e, 160)}") from None
    finally:
        with torch.no_grad():
            for b, value in saved:
                b.copy_(value)


class _Passed(Exception):
    """A listener's own error, carried through the model's forward unchanged."""

    def __init__(self, error: Exception):
        super().__init__(str(error))
        self.error = error


class _Mode(TorchFunctionMode):
    """Runs every torch call of the forward, then tells the listeners (outside leaf modules)."""

    def __init__(self, listeners: Sequence[Listener], depth: list[int], blank: bool):
        super().__init__()
        self.listeners, self.depth, self.blank = listeners, depth, blank

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = _conv_shape(args, kwargs) if self.blank and func in _SHORTCUT else None
        out = func(*args, **kwargs) if out is None else out
        if not self.depth[0]:
            call = Call(func, args, kwargs, out)
            for listener in self.listeners:
                given = _told(listener.call, call)
                out = out if given is None else given  # a shape read, its width marked (the walk's)
        return out


def _told(tell: Callable, *what):
    """A listener told ``what``, and what it answers; its own error is carried through the
    forward as it is."""
    try:
        return tell(*what)
    except Exception as e:
        raise _Passed(e) from None


def blank(inputs: tuple) -> bool:
    """Whether no input tensor holds a value other than zero (``default_example``'s, the
    network table's): a forward of it carries no values to follow."""
    return not any(bool(t.any()) for t in inputs if isinstance(t, torch.Tensor))


class ShapesOnly(TorchFunctionMode):
    """For the block, a convolution gives zeros of the shape it would give (``_conv_shape``)
    and everything else runs as it is: a forward of a blank input exactly as ``capture`` ran
    the original, which asks of a cut network only whether its shapes agree (``verify.runs``).
    Arguments a real convolution would refuse (channels, groups, a bias, a dtype or a device
    that do not fit its weight) run it, so that it says so."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = _conv_shape(args, kwargs) if func in _SHORTCUT else None
        return func(*args, **kwargs) if out is None else out


def _conv_shape(args, kwargs) -> torch.Tensor | None:
    """Zeros of the shape ``F.convNd`` would give (None where the arguments are not the plain
    ones, or ones it would refuse): what a blank example needs of a convolution, without its
    arithmetic."""
    if kwargs or len(args) != 7 or not isinstance(args[0], torch.Tensor) or args[0].dim() < 3:
        return None
    x, w, b, stride, padding, dilation, groups = args
    d = x.dim() - 2
    if not all(isinstance(v, (tuple, list)) and len(v) == d for v in (stride, padding, dilation)) \
            or not isinstance(w, torch.Tensor) or w.dim() != x.dim() or x.shape[1] != w.shape[1] * groups \
            or w.shape[0] % groups or (w.dtype, w.device) != (x.dtype, x.device) \
            or not (b is None or isinstance(b, torch.Tensor) and b.shape == w.shape[:1]
                     and (b.dtype, b.device) == (w.dtype, w.device)):
        return None
    size = [(n + 2 * p - dl * (k - 1) - 1) // s + 1 for n, p, dl, k, s in
            zip(x.shape[2:], padding, dilation, w.shape[2:], stride)]
    return x.new_zeros(x.shape[0], w.shape[0], *size) if min(size) > 0 else None
