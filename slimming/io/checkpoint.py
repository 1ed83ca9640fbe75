"""Checkpoints: plain dicts of tensors and Python values, written atomically, read safely.

Format (``version`` 1)::

    {"format": "slimming", "version": 1,
     "arch": "vgg", "options": {"depth": 19, "num_classes": 10},
     "cfg": None | [widths...],          # None: the family's default widths
     "cfg_mask": None | [bool tensor per BatchNorm2d of the network it was pruned from],
     "gates": {layer name: width} (only for a run with gates: slimming.add_gates, --gates),
     "head_gates": {layer name: number of heads} (the same, for gates per attention head),
     "widths": {"module.attribute": int} (a pruned torchvision/timm/user network: the
               integer attributes the cut set, such as an attention's num_heads),
     "baked": [layer names] (of such a network: layers whose forward computed their weight,
              weight standardisation, made the plain layers they ran: slimming.layers.baked),
     "removed": {layer name: "Emptied" | "Constant"} (of such a network: the layers of a
                residual branch cut whole, which compute nothing or a constant:
                slimming.layers.removed),
     "state_dict": {...}, "epoch": completed epochs, "acc": test accuracy (%), "best_acc": ...,
     "optimizer": ..., "scheduler": ..., "args": {...the run's arguments...}, ...}

Files of the paper's own PyTorch code (no "arch") load too, given their arch: slimming.io.paper.
Everything loads with ``torch.load(path, weights_only=True)``, bounded by ``slimming.utils.safeload``:
nothing in a file is executed, and nothing in it costs more than its size warrants. Every field
is checked (type, range, the declared options against the weights' shapes) before anything is
built from it.
"""

from __future__ import annotations

import copy
import math
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .. import models
from ..errors import CheckpointError, SlimmingError, clip, first_line, load_error
from ..layers.attention import thinned
from ..layers.baked import baked_layers, rebake
from ..layers.gates import attach, gated_layers
from ..layers.removed import remove_again, removed_layers
from ..layers.resize import int_attributes, resize_like, set_int_attributes
from ..models.common import ChannelSelect
from ..models.external import check_forward, check_kwargs, is_external, is_user_code
from ..utils.modules import unwrap
from ..utils.safeload import read_file, save_checked, verify_checksum
from .paper import from_paper
from .structure import check_declared

FORMAT, VERSION = "slimming", 1
NUMBER_FIELDS = ("acc", "best_acc", "source_acc", "threshold", "percent", "sparsity_strength")


def save_checkpoint(ckpt: dict[str, Any], path: str | os.PathLike) -> None:
    """Write ``ckpt`` plus its ``checksum`` to ``path`` atomically (``save_checked``): a crash
    or a signal leaves the old file or the new one, never half of one; flipped bits are caught
    by the checksum on load; tensors are saved from the CPU."""
    save_checked(ckpt, path)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_fields(ckpt: dict, path: Path) -> None:
    """Types and ranges of the fields a command reads, with one line per problem."""
    def bad(field: str, what: str) -> CheckpointError:
        return CheckpointError(f"{path}: its {field!r} is {clip(ckpt.get(field), 60)}: {what}")

    if ckpt.get("format", FORMAT) != FORMAT:
        raise bad("format", f"expected {FORMAT!r}: not a slimming checkpoint")
    version = ckpt.get("version", VERSION)
    if not _is_int(version) or version < 1:
        raise bad("version", "expected a positive integer")
    if version > VERSION:
        raise CheckpointError(f"{path}: written by a newer slimming (checkpoint version {version}; "
                              f"this one reads up to {VERSION}): upgrade slimming")
    if not isinstance(ckpt["arch"], str):
        raise bad("arch", "expected a name such as 'vgg' or 'torchvision:resnet18'")
    external = is_external(ckpt["arch"])
    if ckpt["arch"] not in models.FAMILIES and not external:
        raise bad("arch", f"expected one of: {', '.join(sorted(models.FAMILIES))}, or "
                  "torchvision:NAME, timm:NAME")
    options = ckpt.get("options")
    if options is not None and not isinstance(options, dict):
        raise bad("options", "expected a dict such as {'depth': 19, 'num_classes': 10}")
    for key, value in (options or {}).items():
        if external and key == "kwargs":
            try:
                check_kwargs(value)
            except ValueError as e:
                raise CheckpointError(f"{path}: its options: {e}") from None
        elif external and key == "input_size":
            if not isinstance(value, list) or len(value) != 3 or not all(
                    _is_int(v) and 1 <= v <= 4096 for v in value):
                raise bad("options", "its input_size is not [C, H, W]")
        elif not isinstance(key, str) or not _is_int(value) or value < 1:
            raise CheckpointError(f"{path}: option {clip(key, 40)} = {clip(value, 40)}: "
                                  "expected a positive integer")
    cfg = ckpt.get("cfg")
    removed = ckpt.get("removed") if isinstance(ckpt.get("removed"), dict) else {}
    if external:  # a width of 0: a norm of a branch cut whole, which the file says it removed
        if cfg is not None and (not isinstance(cfg, dict) or not all(
                isinstance(k, str) and _is_int(v) and (v >= 1 or v == 0 and removed.get(k) == "Emptied")
                for k, v in cfg.items())):
            raise bad("cfg", "expected None or {BatchNorm name: positive width}")
    elif cfg is not None and (not isinstance(cfg, list) or not all(
            v == "M" or (_is_int(v) and v >= 1) for v in cfg)):
        raise bad("cfg", "expected None or a list of positive widths (and 'M')")
    for key, what in (("gates", "the width its gate scales"), ("head_gates", "the heads its gate scales"),
                      ("widths", "an integer attribute's value")):
        value = ckpt.get(key)
        if value is not None and (not isinstance(value, dict) or not all(
                isinstance(k, str) and _is_int(v) and (key == "widths" or v >= 1)
                for k, v in value.items())):
            named = "module.attribute" if key == "widths" else "layer name"
            raise bad(key, f"expected None or {{{named}: {what}}}")
    masks = ckpt.get("cfg_mask")
    if masks is not None and (not isinstance(masks, list) or not all(
            isinstance(m, torch.Tensor) and m.dtype == torch.bool and m.dim() == 1 for m in masks)):
        raise bad("cfg_mask", "expected None or a list of 1-d bool tensors")
    if ckpt.get("epoch") is not None and (not _is_int(ckpt["epoch"]) or ckpt["epoch"] < 0):
        raise bad("epoch", "expected a count of completed epochs")
    for field in NUMBER_FIELDS:
        value = ckpt.get(field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value)):
            raise bad(field, "expected a finite number")
    for field in ("args", "source", "data", "budget", "compensation"):
        if ckpt.get(field) is not None and not isinstance(ckpt[field], dict):
            raise bad(field, "expected a dict")


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu",
                    arch: str | None = None, depth: int | None = None) -> dict:
    """Read a checkpoint safely (``slimming.utils.safeload``); any problem is one CheckpointError line.

    The weights (``state_dict``) go to ``map_location``; everything else stays on the CPU.
    A file that does not name its architecture (one written by the paper's PyTorch code) needs
    ``arch`` (``vgg``, ``preresnet``/``resnet``, ``densenet``) and is converted to a slimming
    checkpoint (see ``slimming.io.paper``); ``depth`` is then read off its weights unless given.
    For a slimming file, ``arch`` and ``depth`` when given must agree with it.
    """
    path = Path(path)
    ckpt = read_file(path)
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("state_dict"), dict):
        raise CheckpointError(f"{path}: not a checkpoint: it has no 'state_dict'")
    verify_checksum(ckpt, path)
    sd = strip_prefix(ckpt["state_dict"])
    if not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in sd.items()):
        raise CheckpointError(f"{path}: its state_dict holds something other than named tensors")
    ckpt["state_dict"] = sd
    if "arch" not in ckpt:
        if "format" in ckpt:
            raise CheckpointError(f"{path}: a slimming checkpoint without its 'arch': damaged?")
        if arch is None:
            raise CheckpointError(f"{path}: the file does not say its architecture ('arch'): it was "
                                  "not written by slimming; pass arch (vgg, preresnet, densenet)",
                                  param="arch")
        ckpt = {"format": FORMAT, "version": VERSION, **from_paper(ckpt, arch, depth, path)}
        model_from_checkpoint(ckpt, path)  # built on the meta device: any misfit is an error now
    else:
        _check_fields(ckpt, path)
        if is_user_code(ckpt["arch"]) and arch != ckpt["arch"]:  # never run code a file names
            raise CheckpointError(f"{path}: its network is built by your own code "
                                  f"({ckpt['arch']}); pass arch {ckpt['arch']} to run it", param="arch")
        if arch is not None and models.canonical(arch) != ckpt["arch"]:
            raise CheckpointError(f"{path}: the file holds arch {ckpt['arch']!r}, not {arch!r}")
        have = (ckpt.get("options") or {}).get("depth")
        if depth is not None and have is not None and depth != have:
            raise CheckpointError(f"{path}: the file holds a depth-{have} {ckpt['arch']}, not depth {depth}")
    if torch.device(map_location).type != "cpu":
        ckpt["state_dict"] = {k: v.to(map_location) for k, v in ckpt["state_dict"].items()}
    return ckpt


def strip_prefix(state_dict: dict, prefix: str = "module.") -> dict:
    """Drop the ``module.`` prefix that DataParallel/DDP put on every key."""
    if state_dict and all(isinstance(k, str) and k.startswith(prefix) for k in state_dict):
        return {k[len(prefix):]: v for k, v in state_dict.items()}
    return state_dict


def match_dtypes(state: dict, expected: dict, path, parameters=()) -> dict:
    """Cast floating tensors saved in another float precision (a ``model.half()`` or float64
    file) to the network's; refuse any other dtype mismatch (int64 weights), and values no
    training writes (``check_values``)."""
    out = {}
    for key, t in state.items():
        want = expected.get(key)
        if want is not None and t.dtype != want.dtype:
            if not (t.is_floating_point() and want.is_floating_point()):
                raise CheckpointError(f"{path}: {key} is {t.dtype}, expected {want.dtype}")
            t = t.to(want.dtype)
        out[key] = t
    check_values(out, path, parameters)
    return out


def check_values(state: dict, path, parameters=()) -> None:
    """CheckpointError for values no training writes, which would load and compute garbage
    without a word: a NaN anywhere, an infinity in a parameter (named in ``parameters``; a
    buffer may hold a -inf mask), a negative BatchNorm variance."""
    for key, t in state.items():
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.is_meta:
            continue
        if t.isnan().any():
            raise CheckpointError(f"{path}: {key} holds NaN: the run that wrote it diverged "
                                  "(load an earlier checkpoint)")
        if key in parameters and t.isinf().any():
            raise CheckpointError(f"{path}: {key} holds infinite values: the run that wrote it "
                                  "diverged (load an earlier checkpoint)")
        if key.endswith("running_var") and (t < 0).any():
            raise CheckpointError(f"{path}: {key} holds a negative variance, which no BatchNorm "
                                  "computes: an edited or damaged file")


def model_from_checkpoint(ckpt: dict, path: str | os.PathLike = "checkpoint") -> nn.Module:
    """Rebuild the network a loaded checkpoint describes, weights in place (their device).

    The declared options and cfg are checked against the weights' shapes first, so building
    never costs more than the file's tensors warrant."""
    arch, cfg, options = ckpt["arch"], ckpt.get("cfg"), ckpt.get("options") or {}
    if is_external(arch):
        return _external_from_checkpoint(ckpt, path)
    try:
        check_declared(arch, options, cfg, ckpt["state_dict"])
    except KeyError as e:
        raise CheckpointError(f"{path}: its weights are not a {arch}'s: no {e.args[0]!r}") from None
    except (ValueError, IndexError, AttributeError, TypeError) as e:
        raise CheckpointError(f"{path}: its weights do not fit its description: {first_line(e)}") from None
    try:
        model = models.build(arch, cfg=cfg, empty=True, **options)
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{path}: cannot rebuild its network: {first_line(e)}") from None
    _gated(model, ckpt, path)
    state = match_dtypes(ckpt["state_dict"], model.state_dict(), path, dict(model.named_parameters()))
    try:
        model.load_state_dict(state, assign=True)
    except (RuntimeError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"{path}: its weights do not fit arch {arch!r} with cfg "
                              f"{clip(cfg)}: {load_error(e)}") from None
    for name, m in model.named_modules():
        if isinstance(m, ChannelSelect):
            try:
                m.check_index()
            except ValueError as e:
                raise CheckpointError(f"{path}: {name}.index: {e}") from None
    return model


def _external_from_checkpoint(ckpt: dict, path) -> nn.Module:
    """A torchvision/timm/user network: built on the meta device from its builder and options,
    given the widths its state_dict holds (``slimming.layers.resize``), then filled."""
    arch, cfg, sd = ckpt["arch"], ckpt.get("cfg"), ckpt["state_dict"]
    removed = ckpt.get("removed")
    for name, width in (cfg or {}).items():  # the declared widths against the weights, first
        if width == 0 and isinstance(removed, dict) and removed.get(name) == "Emptied":
            continue  # a norm of a branch cut whole: no weights
        stats = sd.get(f"{name}.running_mean", sd.get(f"{name}.weight"))
        if stats is None or stats.dim() != 1 or stats.numel() != width:
            raise CheckpointError(f"{path}: its cfg says {name} has {width} channels; its weights "
                                  "disagree")
    try:
        model = models.build(arch, cfg=cfg, empty=True, **(ckpt.get("options") or {}))
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{path}: cannot rebuild its network: {first_line(e)}") from None
    rebake(model, ckpt.get("baked"), path)
    remove_again(model, removed, sd, path)
    resize_like(model, sd, str(path))
    set_int_attributes(model, ckpt.get("widths"), path)
    thinned(model)
    _gated(model, ckpt, path)
    state = match_dtypes(sd, model.state_dict(), path, dict(model.named_parameters()))
    try:
        model.load_state_dict(state, assign=True)
    except (RuntimeError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"{path}: its weights do not fit {arch}: {load_error(e)}") from None
    options = ckpt.get("options") or {}
    try:  # the widths the weights give must also fit each other (a BatchNorm as wide as its
        # convolution, a classifier that takes what the features give): one forward of two
        # images here, so that eval, stats and export refuse such a file as prune does
        check_forward(arch, model, options.get("input_size"), options.get("num_classes"))
    except ValueError as e:
        raise CheckpointError(f"{path}: its weights do not fit together: {e}") from None
    return model


def _gated(model: nn.Module, ckpt: dict, path) -> None:
    """The gates a checkpoint of a run with ``--gates`` says its network had, put back before
    its weights are loaded (``slimming.layers.gates``)."""
    try:
        if ckpt.get("gates"):
            attach(model, ckpt["gates"])
        if ckpt.get("head_gates"):
            attach(model, ckpt["head_gates"], heads=True)
    except SlimmingError as e:
        raise CheckpointError(f"{path}: its gates do not fit its network: {e}") from None


def load_model(path: str | os.PathLike, device: str | torch.device = "cpu", arch: str | None = None,
               depth: int | None = None) -> nn.Module:
    """Rebuild any slimming checkpoint (pruned or not), or one of the paper's code given its
    ``arch``, as a ready-to-use ``nn.Module`` in eval mode on ``device``. Raises CheckpointError
    with a one-line reason for unusable files."""
    ckpt = load_checkpoint(path, map_location=device, arch=arch, depth=depth)
    return model_from_checkpoint(ckpt, path).eval()


def checkpoint_dict(model: nn.Module, **fields: Any) -> dict[str, Any]:
    """The checkpoint of ``model``: how to rebuild it plus ``fields`` (epoch, acc, ...)."""
    model = unwrap(model)
    if is_external(model.arch):
        cfg = model.cfg or None  # None until pruned, then {BatchNorm name: width}
    else:
        default = models.build(model.arch, empty=True, **model.options).cfg
        cfg = None if model.cfg == default else model.cfg
    extra = {key: found for key, found in (("gates", gated_layers(model)),  # slimming.add_gates
                                           ("head_gates", gated_layers(model, heads=True))) if found}
    if is_external(model.arch) and cfg:  # pruned: the integer attributes the cut set (num_heads)
        extra["widths"] = int_attributes(model)
        for key, found in (("baked", baked_layers(model)), ("removed", removed_layers(model))):
            if found:
                extra[key] = found
    return {"format": FORMAT, "version": VERSION, "arch": model.arch,
            "options": copy.deepcopy(model.options), "cfg": copy.deepcopy(cfg),
            **extra, "state_dict": model.state_dict(), **fields}
