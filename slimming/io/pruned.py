"""A pruned network of your own class, saved without its code: ``save_pruned(model, path)``
writes its weights (whose shapes are its widths) as a checksummed weights-only file, and
``load_pruned(path, MyNet())`` gives a fresh instance of your class those widths and weights. The
file names no class and imports nothing: the code is yours, the file is only tensors."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import CheckpointError, SlimmingError, clip, first_line, load_error
from ..layers.attention import thinned
from ..layers.baked import baked_layers, rebake
from ..layers.removed import remove_again, removed_layers
from ..layers.resize import int_attributes, resize_like, set_int_attributes
from ..utils.modules import modes_kept, restored_on_error, unwrap
from ..utils.safeload import read_file, save_checked, verify_checksum
from .checkpoint import check_values, match_dtypes

FORMAT, VERSION = "slimming-pruned", 1
RESERVED = ("format", "version", "widths", "state_dict", "checksum", "example_shape", "buffers",
            "baked", "removed")  # not fields
EXAMPLE = "_slimming_example_shape"  # what prune sets on the network it returns: its example's shape


def save_pruned(model: nn.Module, path: str | os.PathLike, **fields: Any) -> None:
    """Write ``model``'s state_dict (unwrapped from DDP / torch.compile) to ``path``, atomically,
    with a checksum, and its modules' integer attributes (the widths the cut set: a C2f block's
    ``c``, a GroupNorm's ``num_groups``) and, for a network ``prune`` returned, the shape of the
    example it was cut on (``load_pruned`` runs one forward at that shape); ``fields``: plain
    values to keep with it (the epoch, an accuracy), not named as the file's own."""
    model, path = _module(model), _path(path)
    taken = [k for k in fields if k in RESERVED]
    if taken:
        raise SlimmingError(f"save_pruned: {taken[0]!r} is the file's own field; name yours otherwise",
                            param="fields")
    odd = [k for k, v in fields.items() if not _plain(v)]
    if odd:  # what weights_only loads: never write a file load_pruned refuses
        raise SlimmingError(f"save_pruned: the field {clip(odd[0])} holds {type(fields[odd[0]]).__name__}, "
                            "not a plain value (numbers, strings, tensors, and lists and dicts of them)",
                            param="fields")
    state = model.state_dict()
    if any(v.is_meta for v in state.values() if isinstance(v, torch.Tensor)):
        raise SlimmingError(f"{type(model).__name__} is on the meta device: it holds no weights to save",
                            param="model")
    odd = [k for k, v in state.items() if not isinstance(v, torch.Tensor)]
    if odd:  # load_pruned reads named tensors only: never write a file it would refuse
        raise SlimmingError(f"{type(model).__name__}'s state_dict holds {clip(odd[0])}, which is not a "
                            "tensor (extra state): save_pruned writes tensors only", param="model")
    try:  # never write a file load_pruned refuses: NaN, a negative variance, ...
        check_values(state, type(model).__name__, dict(model.named_parameters()))
    except CheckpointError as e:
        raise SlimmingError(f"save_pruned: {e}", param="model") from None
    if path.is_dir():
        raise SlimmingError(f"{path} is a folder: save_pruned writes a file (give its name)", param="path")
    if any(p.exists() and not p.is_dir() for p in path.parents):
        raise SlimmingError(f"{path}: a file stands where its folder would be", param="path")
    shape = getattr(model, EXAMPLE, None)
    example = {"example_shape": list(shape)} if _example_shape(shape) else {}
    # buffers outside the state_dict (persistent=False: EVA's k_bias) the cut may have narrowed
    loose = {n: b for n, b in model.named_buffers() if n not in state}
    baked = baked_layers(model)  # layers that computed their weight, now plain (slimming.layers.baked)
    removed = removed_layers(model)  # layers of a branch cut whole: nothing or a constant (.removed)
    blob = {"format": FORMAT, "version": VERSION, **fields, **example, "widths": int_attributes(model),
            "state_dict": state, **({"buffers": loose} if loose else {}),
            **({"baked": baked} if baked else {}), **({"removed": removed} if removed else {})}
    try:
        save_checked(blob, path)
    except (OSError, RuntimeError) as e:  # a full disk (torch's writer: RuntimeError), a read-only folder
        raise SlimmingError(f"{path}: cannot write it ({first_line(e, 160)}); nothing was written",
                            param="path") from None


def _plain(value, depth: int = 0) -> bool:
    """Whether ``value`` is what ``torch.load(weights_only=True)`` gives back: None, a bool, a
    number, a string, a tensor (not on the meta device), or a list, tuple or dict (plain keys)
    of them, at most 32 deep."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, torch.Tensor):
        return not value.is_meta
    if depth >= 32:
        return False
    if isinstance(value, (list, tuple)):
        return all(_plain(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all((k is None or isinstance(k, (str, int, float))) and _plain(v, depth + 1)
                   for k, v in value.items())
    return False


def _example_shape(shape) -> bool:
    """A shape load_pruned may build zeros of: 2 to 6 positive ints, at most 2**26 elements."""
    return isinstance(shape, (list, tuple)) and 2 <= len(shape) <= 6 \
        and all(type(n) is int and n > 0 for n in shape) and math.prod(shape) <= 1 << 26


def _path(path) -> Path:
    if not isinstance(path, (str, os.PathLike)) or not str(path):  # bytes is neither
        raise SlimmingError(f"path must be a file name (str or Path), not {clip(repr(path))}", param="path")
    return Path(path)


def _module(model) -> nn.Module:
    if not isinstance(model, nn.Module):
        raise SlimmingError(f"model must be an nn.Module (a fresh instance of the pruned class), not "
                            f"{type(model).__name__}", param="model")
    return unwrap(model)


def load_pruned(path: str | os.PathLike, model: nn.Module, example_inputs=None) -> nn.Module:
    """``model`` (a freshly built, unpruned instance of the class that was pruned) given the
    widths and weights saved in ``path``, in place; returned in eval mode. Every layer takes the
    width its weights have in the file, every integer attribute the value saved; anything else
    must match as built. CheckpointError (one line) for a file that is not one, or weights that
    do not fit, checked before anything is changed; a load that fails leaves ``model`` as it was.
    An instance built on the meta device takes the file's tensors. ``example_inputs`` (default:
    zeros of the model's ``input_size``, where it declares one, else of the shape the network was
    cut on, which ``save_pruned`` keeps): one forward checks that the widths fit each other (a
    linear layer reading more channels than the layer before makes)."""
    path, model = _path(path), _module(model)
    blob = read_file(path)  # bounded, weights_only
    if not isinstance(blob, dict) or blob.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a file written by slimming.save_pruned")
    if blob.get("version") != VERSION:
        raise CheckpointError(f"{path}: a save_pruned file of version {blob.get('version')!r}, not {VERSION}")
    if "checksum" not in blob:
        raise CheckpointError(f"{path}: has no checksum, which save_pruned always writes: an edited or "
                              "damaged file")
    verify_checksum(blob, path)
    state = blob.get("state_dict")
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        raise CheckpointError(f"{path}: its state_dict holds something other than named tensors")
    _check_shapes(model, state, path)
    loose = _loose_buffers(model, blob.get("buffers", {}), path)
    meta = any(t.is_meta for t in (*model.parameters(), *model.buffers()))
    group_sizes = {name: m.num_channels // m.num_groups for name, m in model.named_modules()
                   if isinstance(m, nn.GroupNorm) and m.num_groups > 0}
    with torch.no_grad(), restored_on_error(model, values=True):
        rebake(model, blob.get("baked"), path)  # the layers the cut baked: plain ones, as saved
        remove_again(model, blob.get("removed"), state, path)  # a branch's layers cut whole, as saved
        resize_like(model, state, str(path))
        set_int_attributes(model, blob.get("widths"), path)
        _whole_groups(model, group_sizes, path)
        thinned(model)
        for name, t in loose.items():  # narrowed by the cut: the file's
            owner, _, attr = name.rpartition(".")
            built = model.get_submodule(owner)._buffers[attr]
            model.get_submodule(owner)._buffers[attr] = t.to(built.dtype).to(built.device)
        state = match_dtypes(state, model.state_dict(), path, dict(model.named_parameters()))
        try:  # an instance built on the meta device takes the file's tensors themselves
            model.load_state_dict(state, strict=True, assign=meta)
        except (RuntimeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{path}: its weights do not fit {type(model).__name__}: "
                                  f"{load_error(e)}") from None
        shape = blob.get("example_shape")
        if example_inputs is None and shape is not None:
            if not _example_shape(shape):
                raise CheckpointError(f"{path}: its example_shape is {clip(repr(shape))}, not a shape")
            if not isinstance(getattr(model, "input_size", None), (list, tuple)):
                _runs_bounded(model, shape, path)  # the shape it was cut on, which the file says
                return model.eval()
        _runs(model, example_inputs, path)
    return model.eval()


ACTIVATIONS = 1 << 30  # bytes the forward on a file's example_shape may allocate, over all its ops
SMALL_INPUT = 1 << 22  # elements of an example_shape run for real where the cost cannot be told


def _runs_bounded(model: nn.Module, shape: list[int], path) -> None:
    """``_runs`` on zeros of the file's ``example_shape``, at a cost the file cannot inflate (a
    file of a few KB saying 4096 x 4096 would take gigabytes): the forward runs first on fake
    tensors (shapes only, no memory: widths that do not fit fail there too), counting the bytes
    its ops would allocate; for real where that is at most ``ACTIVATIONS``, else the shapes'
    word stands. Where fake tensors cannot run it (an op whose output shape depends on values:
    a detector's ``nonzero``), for real where the input has at most ``SMALL_INPUT`` elements;
    a larger one is refused in one line (pass ``example_inputs``)."""
    device = next((t.device for t in model.parameters()), torch.device("cpu"))
    cost = _fake_cost(model, shape, device)
    if cost is not None and cost > ACTIVATIONS:
        return
    if cost is None and math.prod(shape) > SMALL_INPUT:
        raise CheckpointError(f"{path}: its example_shape {clip(repr(shape))} is too large to check the "
                              f"widths on ({math.prod(shape)} elements); pass example_inputs= of the size "
                              "you run")
    _runs(model, torch.zeros(*shape, device=device), path)


def _fake_cost(model: nn.Module, shape: list[int], device) -> int | None:
    """The bytes ``model``'s eval forward on zeros of ``shape`` allocates over all its ops (an
    upper bound on its peak), told by a run on fake tensors; None where it cannot run so."""
    try:
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_leaves
    except ImportError:  # a torch without them: the cost cannot be told
        return None

    class Counted(TorchDispatchMode):
        total = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            Counted.total += sum(t.numel() * t.element_size() for t in tree_leaves(out)
                                 if isinstance(t, torch.Tensor))
            return out

    try:
        with modes_kept(model), torch.no_grad(), FakeTensorMode(allow_non_fake_inputs=True):
            x = torch.zeros(*shape, device=device)
            with Counted():
                model.eval()(x)
    except Exception:  # noqa: BLE001 (what fake tensors cannot run, or widths that do not fit: for real)
        return None
    return Counted.total


def _runs(model: nn.Module, example_inputs, path) -> None:
    """One forward on ``example_inputs`` (or zeros of the model's ``input_size``), in eval mode;
    CheckpointError where the loaded widths do not fit each other."""
    size = getattr(model, "input_size", None)
    if example_inputs is None and not (isinstance(size, (list, tuple)) and all(type(n) is int for n in size)):
        return
    device = next((t.device for t in model.parameters()), torch.device("cpu"))
    inputs = example_inputs if example_inputs is not None else torch.zeros(1, *size, device=device)
    inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    with modes_kept(model):
        try:
            model.eval()(*inputs)
        except Exception as e:  # noqa: BLE001 (any failure of the forward is the file's widths)
            raise CheckpointError(f"{path}: the loaded widths do not fit each other: the forward "
                                  f"fails ({first_line(e, 160)})") from None


def _whole_groups(model: nn.Module, sizes: dict[str, int], path) -> None:
    """CheckpointError unless every GroupNorm kept the size of its groups as built: a cut
    removes whole groups (its ``num_groups`` falls with its channels), so a file whose
    ``num_groups`` was forged (4 -> 2 on the same channels) normalises over other groups and
    computes something else, though its forward runs."""
    for name, size in sizes.items():
        m = model.get_submodule(name)
        if m.num_groups < 1 or m.num_channels != m.num_groups * size:
            raise CheckpointError(f"{path}: {name or 'the model'} is a GroupNorm of {m.num_groups} groups "
                                  f"over {m.num_channels} channels, but a cut keeps its groups of {size}: "
                                  "an edited or damaged file")


def _loose_buffers(model: nn.Module, buffers, path) -> dict[str, torch.Tensor]:
    """The file's buffers outside the state_dict (``persistent=False``) whose shape differs from
    the instance built: each must be such a buffer of the model, of its rank, no dim wider
    (checked before anything changes). Those of the built shape stay as the code made them."""
    if not isinstance(buffers, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                                for k, v in buffers.items()):
        raise CheckpointError(f"{path}: its buffers hold something other than named tensors")
    own = dict(model.named_buffers())
    persistent = model.state_dict(keep_vars=True)
    for key, t in buffers.items():
        built = own.get(key)
        if built is None or key in persistent:
            raise CheckpointError(f"{path}: {clip(key)} is no buffer of {type(model).__name__} kept outside "
                                  "its state_dict")
        _narrower(key, t, built, path)
    check_values(buffers, path)  # NaN is no buffer's value (an infinite mask may be)
    return {k: t for k, t in buffers.items() if t.shape != own[k].shape}


def _narrower(key: str, t: torch.Tensor, built: torch.Tensor, path) -> None:
    """CheckpointError unless the file's ``t`` has ``built``'s rank and no dim wider."""
    if t.dim() != built.dim() or any(a > b for a, b in zip(t.shape, built.shape)):
        raise CheckpointError(f"{path}: {clip(key)} has shape {tuple(t.shape)[:6]}, wider than the "
                              f"{tuple(built.shape)} built: a cut only narrows")


def _check_shapes(model: nn.Module, state: dict, path) -> None:
    """Before anything is changed: every tensor the file gives a module has that tensor's rank
    and no dim wider than the instance built (a cut only narrows), and none is cut to zero where
    the built one is not. So a small file cannot ask for gigabytes (a zero-element weight 2**31
    wide), and a layer wider than the one before it, or emptied, is refused here, not at the
    first forward."""
    own = model.state_dict(keep_vars=True)
    for key, t in state.items():
        built = own.get(key)
        if built is None:
            continue  # strict loading names it
        _narrower(key, t, built, path)
        if any(a == 0 < b for a, b in zip(t.shape, built.shape)):
            raise CheckpointError(f"{path}: {clip(key)} has shape {tuple(t.shape)}: a layer cut to zero "
                                  "channels")
