"""Networks from elsewhere: ``torchvision:NAME``, ``timm:NAME`` and ``package.module:function``.

``build_external(arch, num_classes=..., kwargs=..., input_size=...)`` calls the library's own
builder (``torchvision.models.get_model(NAME, weights=None, ...)``, ``timm.create_model(NAME,
pretrained=False, ...)``) or the user's function, and tags the module with what rebuilds it:
``arch``, ``options`` (``num_classes``, ``kwargs``, ``input_size``) and ``cfg`` (None until
pruning; then ``{BatchNorm name: width}``). Nothing downloads: pretrained weights come through
``slimming train --init PATH``, a file the user has.

A ``package.module:function`` arch imports and runs the user's own code. It is only ever run
when the user names it (``--arch`` on the command line, ``arch=`` in Python), never because a
checkpoint says so: ``slimming.io.checkpoint`` refuses such a file unless the same arch is given.
Giving such a network the widths of a pruned state_dict is layer knowledge, in
``slimming.layers.resize``.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import math
import re

import torch
from torch import nn

from ..errors import clip, first_line, is_out_of_memory

LIBRARIES = ("torchvision", "timm")
# what a checkpoint's kwargs may hold: plain JSON, small (a builder's options, not data)
KWARGS_MAX_BYTES, KWARGS_MAX_INT = 4096, 4096
REFUSED_KWARGS = ("weights", "weights_backbone", "pretrained", "pretrained_backbone", "pretrained_cfg",
                  "pretrained_cfg_overlay", "checkpoint_path")
# no-download arguments, passed to every builder that takes them (torchvision's detection and
# segmentation builders default to downloading an ImageNet backbone)
NO_WEIGHTS = {"weights_backbone": None, "pretrained_backbone": False}
# 2^30 parameters: 4 GiB of float32 weights, 16 GiB to train with momentum; more than any
# classifier slimmed here (ConvNeXt-XXLarge has 846M), and far less than a forged width asks for
MAX_PARAMS = 1 << 30


def is_external(arch: str) -> bool:
    return isinstance(arch, str) and ":" in arch


def is_user_code(arch: str) -> bool:
    """``package.module:function``: the user's own code (only run when the user names it)."""
    return is_external(arch) and arch.split(":", 1)[0] not in LIBRARIES


def check_kwargs(kwargs) -> dict:
    """A builder's keyword arguments: a dict of plain JSON values, at most 4 KiB, integers at
    most 4096 (no 10^6-block networks from a small file), no pretrained-weight options."""
    if not isinstance(kwargs, dict):
        raise ValueError(f"model kwargs must be a JSON object, got {type(kwargs).__name__}")
    try:
        text = json.dumps(kwargs)
    except (TypeError, ValueError):
        raise ValueError("model kwargs must hold plain JSON values") from None
    if len(text) > KWARGS_MAX_BYTES:
        raise ValueError(f"model kwargs longer than {KWARGS_MAX_BYTES} bytes")
    for n in _numbers(kwargs):
        if not math.isfinite(n) or abs(n) > KWARGS_MAX_INT:
            raise ValueError(f"model kwargs hold {n!r}: numbers above {KWARGS_MAX_INT} (or not finite) "
                             "are refused")
    refused = [k for k in kwargs if k in REFUSED_KWARGS]
    if refused:
        raise ValueError(f"model kwarg {refused[0]!r}: nothing downloads; start from weights of "
                         "your own (slimming train --init PATH)")
    return kwargs


def _numbers(value):
    """Every number in a JSON value (an int, a float, however written: 1e20, Infinity)."""
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _numbers(v)
    elif isinstance(value, list):
        for v in value:
            yield from _numbers(v)


def _no_weights(builder, call: dict) -> dict:
    """``call`` plus the no-download arguments that ``builder`` takes."""
    takes = inspect.signature(builder).parameters
    return {**{k: v for k, v in NO_WEIGHTS.items() if k in takes}, **call}


def _builder(arch: str):
    source, name = arch.split(":", 1)
    if source == "torchvision":
        import torchvision.models as tvm

        if name not in tvm.list_models():
            raise ValueError(f"torchvision has no model {clip(name)} (see torchvision.models.list_models())")
        builder = tvm.get_model_builder(name)
        return lambda **kw: builder(weights=None, **_no_weights(builder, kw))
    if source == "timm":
        try:
            import timm
        except ImportError:
            raise ValueError("timm models need the timm extra: pip install -e \".[timm]\"") from None
        if not timm.is_model(name):
            raise ValueError(f"timm has no model {clip(name)} (see timm.list_models())")
        return lambda **kw: timm.create_model(name, pretrained=False, **kw)
    if not re.fullmatch(r"[A-Za-z_][\w.]*", source) or not name.isidentifier():
        raise ValueError(f"{clip(arch)}: give torchvision:NAME, timm:NAME or package.module:function")
    try:
        module = importlib.import_module(source)
    except ImportError as e:
        raise ValueError(f"cannot import {clip(source)} for --arch {clip(arch)} ({first_line(e)})") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"{clip(source)} has no function {clip(name)}")
    return fn


def build_external(arch: str, cfg: dict | None = None, *, empty: bool = False,
                   num_classes: int | None = None, kwargs: dict | None = None,
                   input_size: list | tuple | None = None) -> nn.Module:
    """Build ``arch`` (on the meta device when ``empty``: fill it with ``load_state_dict(...,
    assign=True)`` after ``slimming.layers.resize.resize_like``). Raises ValueError for a name the
    library does not have, kwargs it refuses, or a builder that fails."""
    kwargs = check_kwargs(dict(kwargs or {}))
    builder = _builder(arch)
    call = dict(kwargs)
    if num_classes is not None:
        takes = inspect.signature(builder).parameters
        if "num_classes" in takes or any(p.kind == p.VAR_KEYWORD for p in takes.values()):
            call["num_classes"] = num_classes
    if input_size is not None and (len(input_size) != 3 or not all(
            isinstance(v, int) and 1 <= v <= 4096 for v in input_size)):
        raise ValueError(f"input_size must be C, H, W (each 1 to 4096), got {input_size!r}")
    model = None
    if input_size is not None and arch.startswith("timm:") and "img_size" not in call:
        try:  # a vision transformer is built for the image size asked (its position embedding
            # sized to it, as timm does); a CNN takes no img_size and is built as it is
            model = _construct(arch, builder, {**call, "img_size": list(input_size[1:])}, empty=True)
            call["img_size"] = list(input_size[1:])
        except ValueError:
            pass
    model = model or _construct(arch, builder, call, empty=True)
    _check_size(arch, model)  # before a byte is allocated
    if not empty:  # an empty model is checked by whoever fills it (slimming.io.checkpoint)
        model = _construct(arch, builder, call, empty=False)
        check_forward(arch, model, input_size, num_classes)
    model.arch = arch
    model.options = {"num_classes": num_classes, "kwargs": kwargs,
                     "input_size": list(input_size) if input_size else None}
    model.options = {k: v for k, v in model.options.items() if v is not None}
    model.cfg = dict(cfg) if cfg else None
    if input_size:
        model.input_size = tuple(input_size)
    return model


def _construct(arch: str, builder, call: dict, empty: bool) -> nn.Module:
    ctx = torch.device("meta") if empty else contextlib.nullcontext()
    try:
        with ctx:
            model = builder(**call)
    except Exception as e:  # a library's or the user's code, with options from a flag or a file:
        # whatever it raises (ZeroDivisionError for round_nearest 0, ...) is a bad option
        raise ValueError(f"{clip(arch)} with {clip(call)}: {clip(first_line(e, 160), 160)}") from None
    if not isinstance(model, nn.Module):
        raise ValueError(f"{clip(arch)} returned a {type(model).__name__}, not an nn.Module")
    return model


def _check_size(arch: str, model: nn.Module) -> None:
    """At most MAX_PARAMS parameters (counted on the meta device, before a byte is allocated)."""
    count = sum(p.numel() for p in model.parameters())
    if count > MAX_PARAMS:
        raise ValueError(f"{clip(arch)} with these options has {count:,} parameters; more than "
                         f"{MAX_PARAMS:,} are refused (check width or depth options)")


def check_forward(arch: str, model: nn.Module, input_size, num_classes: int | None) -> None:
    """One forward of a (2, C, H, W) batch of zeros in eval mode, without gradients, must give
    class scores (2, num_classes). Options that change what the network returns (timm's
    features_only, global_pool "", in_chans), networks that are not classifiers (detection,
    segmentation) and weights that do not fit each other fail here, in one ValueError, not at
    the first batch of a run. It runs where the weights are: a real forward of two images
    costs milliseconds, where the meta device's Python fallbacks take seconds for some
    layers (ReLU6). Nothing to check without an ``input_size``."""
    if input_size is None:
        return
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    was_training = model.training
    try:
        with torch.no_grad():
            out = model.eval()(torch.zeros(2, *input_size, device=device))
    except Exception as e:
        if is_out_of_memory(e):
            raise  # the command's one line for an allocation that failed (slimming.cli.parser)
        raise ValueError(f"{clip(arch)} cannot take a batch of {'x'.join(map(str, input_size))} images: "
                         f"{clip(first_line(e, 160), 160)}") from None
    finally:
        model.train(was_training)
    want = num_classes or "classes"
    if not (isinstance(out, torch.Tensor) and out.dim() == 2 and out.shape[0] == 2
            and (num_classes is None or out.shape[1] == num_classes)):
        got = f"shape {tuple(out.shape)}" if isinstance(out, torch.Tensor) else f"a {type(out).__name__}"
        raise ValueError(f"{clip(arch)} returns {got}, not class scores of shape (batch, {want}): the "
                         "commands train classifiers (options such as features_only or global_pool "
                         "change the output; a detector is pruned from Python)")
