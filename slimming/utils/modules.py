"""Small helpers on ``nn.Module`` and tensors that pruning, checkpoints and training share."""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import operator

import torch
from torch import nn

from ..errors import SlimmingError


def eager_model(model, what: str) -> nn.Module:
    """``model`` unwrapped (``unwrap``), or SlimmingError (one line, nothing changed) for what
    ``what`` (``"prune"``) cannot work on: no ``nn.Module`` (a function), a TorchScript module
    or one holding one (forward hooks do not run in it), tensors on the meta device (no values)."""
    if not isinstance(model, nn.Module):
        raise SlimmingError(f"{what} takes a torch.nn.Module, not {type(model).__name__}", param="model")
    model = unwrap(model)
    for name, m in model.named_modules():
        if isinstance(m, torch.jit.ScriptModule):
            raise SlimmingError(f"{name or 'the model'} is a TorchScript module ({type(m).__name__}): {what} "
                                "works on the eager network; script or trace it after", param="model")
    if any(t.is_meta for t in itertools.chain(model.parameters(), model.buffers())):
        raise SlimmingError(f"the model's tensors are on the meta device (no values): load its weights "
                            f"before {what}", param="model")
    return model


def unwrap(model: nn.Module) -> nn.Module:
    """The network inside DataParallel / DistributedDataParallel / torch.compile wrappers."""
    while True:
        if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model


def keep_slices(t: torch.Tensor, mask: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """The slices of ``t`` along ``dim`` that the bool ``mask`` keeps, in new memory
    (``index_select`` copies)."""
    return t.detach().index_select(dim, mask.nonzero().squeeze(1).to(t.device))


def keep_along(t: torch.Tensor, cuts: list[tuple[int, torch.Tensor]]) -> torch.Tensor:
    """``t`` with each (dim, bool mask) of ``cuts`` keeping its slices along that dim, in new
    memory. A convolution's weight cut along its outputs and its inputs (dims 0 and 1) at once
    is gathered in one pass over the kept kernels, not through a copy of the kept rows (a
    ResNet-50's weights at 70% each way, cache cold: 16 ms against 19); a 1x1 kernel's, of
    single numbers, as before (index_select twice is faster there)."""
    t = t.detach()
    if sorted(d for d, _ in cuts) == [0, 1] and t.dim() > 2 and t[0, 0].numel() > 1 and t.is_contiguous():
        rows, cols = (m.nonzero().squeeze(1).to(t.device) for _, m in sorted(cuts, key=lambda c: c[0]))
        n = t.shape[1]
        kernels = (rows[:, None] * n + cols[None, :]).flatten()
        return t.reshape(len(t) * n, -1).index_select(0, kernels).view(len(rows), len(cols), *t.shape[2:])
    for dim, mask in cuts:
        t = keep_slices(t, mask, dim)
    return t


def set_tensor(m: nn.Module, name: str, value: torch.Tensor | None, parameter: bool) -> None:
    """Replace ``m.name`` by ``value`` (a Parameter keeping the old one's requires_grad when
    ``parameter``); nothing when ``value`` is None."""
    if value is None:
        return
    if parameter:
        setattr(m, name, nn.Parameter(value, requires_grad=getattr(m, name).requires_grad))
    else:
        setattr(m, name, value)


@contextlib.contextmanager
def hooked(pre=(), post=()):
    """The one harness for observing a forward: the forward pre-hooks ``pre`` and forward hooks
    ``post`` ((module, hook) pairs, torch's signatures) for the block, every one removed when it
    ends, whatever happens."""
    handles = []
    try:
        handles += [m.register_forward_pre_hook(hook) for m, hook in pre]
        handles += [m.register_forward_hook(hook) for m, hook in post]
        yield
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def restored_on_error(model: nn.Module, values: bool = False):
    """Every module's tensors (parameters, buffers), integer attributes and class (a
    ``MultiheadAttention`` a load made slimming's, a layer it baked, without the mark it left)
    put back as they were if the block raises:
    a load that fails halfway leaves the caller's instance intact. ``values``: their values too
    (a copy of each, for a block that copies into them: ``load_state_dict``)."""
    saved = [(m, dict(m._parameters), dict(m._buffers),
              {k: v for k, v in vars(m).items() if type(v) is int}, type(m), set(vars(m)))
             for m in model.modules()]
    with torch.no_grad():
        copies = [(t, t.clone()) for t in {id(t): t for t in (*model.parameters(), *model.buffers())}.values()
                  if not t.is_meta] if values else []
    try:
        yield model
    except BaseException:
        with torch.no_grad():
            for t, copy in copies:
                if t.shape == copy.shape:
                    t.copy_(copy)
        for m, params, buffers, ints, cls, keys in saved:
            m.__class__ = cls
            for key in set(vars(m)) - keys:  # what the block added (a baked layer's mark)
                del vars(m)[key]
            m._parameters.clear()
            m._parameters.update(params)
            m._buffers.clear()
            m._buffers.update(buffers)
            for k, v in ints.items():
                setattr(m, k, v)
        raise


@contextlib.contextmanager
def modes_kept(model: nn.Module):
    """Every module's train/eval flag and buffers as they were when the block ends, whatever the
    block set: a BatchNorm frozen in eval inside a training model stays frozen, and a forward
    that counts its calls or keeps a running average in a buffer leaves it as it found it (the
    trace, the check and compensation run forwards the user never asked for). Every other
    attribute too (not only tensors): one the forward set (Hugging Face's Swin sets its
    ``window_size`` from the input's size, 4 -> 3 at a smaller one) or added (a cache) is put
    back or removed, and a plain dict, list or set it filled is emptied back to what it held."""
    flags = [(m, m.training) for m in model.modules()]
    attributes = [_attributes(m) for m, _ in flags]
    with torch.no_grad():
        buffers = [(m, k, b, b.clone()) for m in model.modules() for k, b in m._buffers.items()
                   if isinstance(b, torch.Tensor)]
    try:
        yield model
    finally:
        for m, training in flags:
            if m.training != training:  # Module.__setattr__ is slow: a check runs this per module
                m.training = training
        for m, values, contents in attributes:
            _put_back(m, values, contents)
        with torch.no_grad():
            for m, k, b, saved in buffers:
                if m._buffers.get(k) is not b:  # replaced (self.ema = self.ema * 0.9 + ...)
                    m._buffers[k] = b
                if b.shape != saved.shape:  # resized in place (a QAT observer's first min/max)
                    b.resize_(saved.shape)
                b.copy_(saved)


_CONTAINERS = (dict, list, set, collections.OrderedDict)
# torch's own layers, whose forward sets no attribute of theirs (their buffers, a BatchNorm's
# counts, are put back as every buffer is): of a module that runs one's forward, only the
# containers of what it holds are watched, not its hooks' dicts
_PLAIN = {"activation", "batchnorm", "channelshuffle", "container", "conv", "dropout", "flatten",
          "instancenorm", "linear", "normalization", "padding", "pixelshuffle", "pooling", "upsampling"}
_HELD = ("_parameters", "_buffers", "_modules", "_non_persistent_buffers_set")
_OWN_NAMES = {"__init__", "__module__", "__qualname__", "__doc__", "__annotations__", "__dict__",
              "__weakref__", "__firstlineno__", "__static_attributes__"}


@functools.cache
def _plain(cls: type) -> bool:
    """Whether ``cls`` is one of torch's own layers in ``_PLAIN``, or a class that adds nothing
    to one but its ``__init__`` (torchvision's ``Conv2dNormActivation``, a ``Sequential``); not a
    lazy one (it becomes another class in its first forward)."""
    torch_layer = next((c for c in cls.__mro__ if c.__module__.startswith("torch.nn.modules.")), None)
    if torch_layer is None or torch_layer.__module__.rsplit(".", 1)[1] not in _PLAIN \
            or issubclass(cls, nn.modules.lazy.LazyModuleMixin):
        return False
    mine = cls.__mro__[:cls.__mro__.index(torch_layer)]
    return all(set(vars(c)) <= _OWN_NAMES for c in mine)


def _attributes(m: nn.Module) -> tuple[nn.Module, dict, dict]:
    """(``m``, its attributes, what each container among them holds: None where it is empty,
    most hooks' dicts, which need only be empty again; a dict's keys and values in order):
    what ``modes_kept`` puts back."""
    values = vars(m)
    keys = _HELD if _plain(type(m)) else [k for k, v in values.items() if type(v) in _CONTAINERS]
    boxes = [(k, v) for k in keys if type(v := values.get(k)) in _CONTAINERS]
    return m, dict(values), {k: None if not v else (tuple(v), tuple(v.values())) if isinstance(v, dict)
                             else list(v) for k, v in boxes}


def _same(a, b) -> bool:
    """Whether two sequences hold the very same objects, in order."""
    return all(map(operator.is_, a, b))


def _put_back(m: nn.Module, values: dict, contents: dict) -> None:
    now = vars(m)
    if len(now) != len(values) or not (_same(now.values(), values.values()) and _same(now, values)):
        for key in [k for k in now if k not in values]:  # added by the block
            del now[key]
        for key, v in values.items():  # set by the block (an int, a tensor, a module's class)
            if now.get(key, now) is not v:
                now[key] = v
    for key, held in contents.items():
        box = values[key]
        if held is None:
            if box:
                box.clear()
        elif not _holds(box, held):
            box.clear()
            if isinstance(box, dict):
                box.update(zip(*held))
            else:
                box.update(held) if isinstance(box, set) else box.extend(held)


def _holds(box, held) -> bool:
    """Whether the container ``box`` holds what ``held`` listed, the very objects (a dict: the
    same keys with the same values, in order or not)."""
    if isinstance(box, dict):
        keys, values = held
        return len(box) == len(keys) and ((_same(box, keys) and _same(box.values(), values))
                                          or all(box.get(k, box) is v for k, v in zip(keys, values)))
    if len(box) != len(held):
        return False
    if isinstance(box, set):
        return all(x in box for x in held)
    return _same(box, held)
