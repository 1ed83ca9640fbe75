"""Networks from elsewhere: ``torchvision:NAME``, ``timm:NAME`` and ``package.module:function``.

``build_external(arch, num_classes=..., kwargs=..., input_size=...)`` calls the library's own
builder (``torchvision.models.get_model(NAME, weights=None, ...)``, ``timm.create_model(NAME,
pretrained=False, ...)``) or the user's function, and tags the module with what rebuilds it:
``arch``, ``options`` (``num_classes``, ``kwargs``, ``input_size``) and ``cfg`` (None until
pruning; then ``{BatchNorm name: width}``). Nothing downloads: pretrained weights come through
``slimming train --init PATH``, a file the user has.

A ``package.module:function`` arch imports and runs the user's own code. It is only ever run
when the user names it (``--arch`` on the command line, ``arch=`` in Python), never because a
checkpoint says so: ``slimming.checkpoint`` refuses such a file unless the same arch is given.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import re

import torch
from torch import nn

LIBRARIES = ("torchvision", "timm")
# what a checkpoint's kwargs may hold: plain JSON, small (a builder's options, not data)
KWARGS_MAX_BYTES, KWARGS_MAX_INT = 4096, 4096
REFUSED_KWARGS = ("weights", "pretrained", "pretrained_cfg", "pretrained_cfg_overlay", "checkpoint_path")


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
    for n in re.findall(r"-?\d+", text):
        if abs(int(n)) > KWARGS_MAX_INT:
            raise ValueError(f"model kwargs hold {n}: numbers above {KWARGS_MAX_INT} are refused")
    refused = [k for k in kwargs if k in REFUSED_KWARGS]
    if refused:
        raise ValueError(f"model kwarg {refused[0]!r}: nothing downloads; start from your own "
                         "weights with --init PATH")
    return kwargs


def _builder(arch: str):
    source, name = arch.split(":", 1)
    if source == "torchvision":
        import torchvision.models as tvm

        if name not in tvm.list_models():
            raise ValueError(f"torchvision has no model {name!r} (see torchvision.models.list_models())")
        return lambda **kw: tvm.get_model(name, weights=None, **kw)
    if source == "timm":
        try:
            import timm
        except ImportError:
            raise ValueError("timm models need the timm extra: pip install -e \".[timm]\"") from None
        if not timm.is_model(name):
            raise ValueError(f"timm has no model {name!r} (see timm.list_models())")
        return lambda **kw: timm.create_model(name, pretrained=False, **kw)
    if not re.fullmatch(r"[A-Za-z_][\w.]*", source) or not name.isidentifier():
        raise ValueError(f"{arch!r}: give torchvision:NAME, timm:NAME or package.module:function")
    try:
        module = importlib.import_module(source)
    except ImportError as e:
        raise ValueError(f"cannot import {source!r} for --arch {arch} ({e})") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"{source} has no function {name!r}")
    return fn


def build_external(arch: str, cfg: dict | None = None, *, empty: bool = False,
                   num_classes: int | None = None, kwargs: dict | None = None,
                   input_size: list | tuple | None = None) -> nn.Module:
    """Build ``arch`` (on the meta device when ``empty``: fill it with ``load_state_dict(...,
    assign=True)`` after ``slimming.surgery.resize_like``). Raises ValueError for a name the
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
    ctx = torch.device("meta") if empty else contextlib.nullcontext()
    try:
        with ctx:
            model = builder(**call)
    except (TypeError, ValueError, KeyError, RuntimeError, AssertionError) as e:
        text = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise ValueError(f"{arch} with {call}: {text}") from None
    if not isinstance(model, nn.Module):
        raise ValueError(f"{arch} returned a {type(model).__name__}, not an nn.Module")
    model.arch = arch
    model.options = {"num_classes": num_classes, "kwargs": kwargs,
                     "input_size": list(input_size) if input_size else None}
    model.options = {k: v for k, v in model.options.items() if v is not None}
    model.cfg = dict(cfg) if cfg else None
    if input_size:
        model.input_size = tuple(input_size)
    return model
