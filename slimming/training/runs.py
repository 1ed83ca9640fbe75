"""What every command shares: the device, where outputs go, the data a checkpoint was
trained on (so that eval, sweep and finetune feed a network what it was trained on), and
reading a checkpoint back into a network."""

from __future__ import annotations

import argparse
import math
import tempfile
from pathlib import Path

import torch
from torch import nn

from .. import models
from ..data.datasets import DATASETS, STATS, build_loaders
from ..errors import CheckpointError, SlimmingError, clip
from ..io.checkpoint import load_checkpoint, model_from_checkpoint
from ..utils import devices
from .config import TrainConfig
from .distributed import DistInfo

DEVICE_FLAGS = ("cpu", "device")  # how a file was made, not what it holds: not recorded in it


def plain_args(args: argparse.Namespace | TrainConfig, leave_out: tuple[str, ...] = ()) -> dict:
    """The run's arguments (a Namespace or a config) as plain values, fit for a weights_only
    checkpoint."""
    return plain({k: v for k, v in vars(args).items() if not callable(v) and k not in leave_out})


def plain(values: dict) -> dict:
    """``values`` with every path as its text."""
    return {k: str(v) if isinstance(v, Path) else v for k, v in values.items()}


def check_output(path: Path, overwrite: bool, resumable: bool = False, param: str = "save") -> None:
    """Refuse to clobber an existing output, or to write where a file blocks the folder.
    ``param``: the argument that named the folder (``save``, ``out``); ``resumable``: the run
    there can be continued (``resume="auto"``), which the message then says."""
    for parent in [path.parent, *path.parent.parents]:
        if parent.exists() and not parent.is_dir():
            raise SlimmingError(f"{parent} is a file, not a folder: choose another {param}", param=param)
    existing = next(p for p in [path.parent, *path.parent.parents] if p.exists())
    try:  # a real probe: permission bits say nothing to root or on a read-only file system
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as e:
        raise SlimmingError(f"cannot write in {existing} ({e.strerror}): choose another {param}",
                            param=param) from None
    if path.is_dir():
        raise SlimmingError(f"{path} is a folder: choose another {param}", param=param)
    if (path.exists() or path.is_symlink()) and not overwrite:
        hint, params = (" or resume auto to continue it", ("overwrite", "resume", param)) if resumable \
            else ("", ("overwrite", param))
        raise SlimmingError(f"{path} already exists: pass overwrite to replace it{hint}, or "
                            f"choose another {param}", param=params)


def device_for(args) -> torch.device:
    """The run's device, chosen quietly: the CPU notice waits for ``announce_device``, so that a
    mistake found while setting up is the only line the user sees."""
    return devices.resolve_device(args.device, args.cpu)


def announce_device(args, device: torch.device) -> None:
    devices.announce(device, chosen=args.cpu or args.device is not None)


def trained_on(ckpt: dict) -> dict:
    """``{"dataset", "data_root"}`` the checkpoint was trained on, when it says (a ``data``
    field, written by prune, or the training run's own ``args``); {} otherwise."""
    for source in (ckpt.get("data"), ckpt.get("args")):
        if isinstance(source, dict) and source.get("dataset") in DATASETS:
            root = source.get("data_root")
            return {"dataset": source["dataset"], "data_root": root if isinstance(root, str) else None}
    return {}


def data_of(ckpt: dict) -> dict | None:
    """The data record a derived checkpoint (pruned) carries on: the source's own, whole
    (image size, mean, std), else what its arguments say, else None."""
    record = ckpt.get("data")
    return dict(record) if isinstance(record, dict) else (trained_on(ckpt) or None)


def default_data(args, ckpt: dict, path=None) -> None:
    """Data flags not given: the checkpoint's (dataset, root, image size, normalisation), else
    cifar10. An image-folder checkpoint from before slimming measured a folder's own mean and
    std was normalised with CIFAR-10's: it gets those again. ``path``: the checkpoint's file
    (default ``args.checkpoint``), for messages."""
    known = trained_on(ckpt)
    same = args.dataset is None or args.dataset == known.get("dataset")
    if args.dataset is None:
        args.dataset = known.get("dataset", "cifar10")
    if args.data_root is None and same and known.get("data_root"):
        args.data_root = Path(known["data_root"])
    record = ckpt.get("data") if isinstance(ckpt.get("data"), dict) else {}
    if args.image_size is None and same and record.get("image_size") is not None:
        args.image_size = recorded_size(ckpt, record["image_size"], path or args.checkpoint)
    if args.norm is None and same:
        mean, std = record.get("mean"), record.get("std")
        if _three_floats(mean) and _three_floats(std):
            args.norm = (tuple(mean), tuple(std))
        elif args.dataset == "imagefolder" and known:
            args.norm = STATS["cifar10"]


FILE_MAX_IMAGE_SIZE = 1024  # the largest image side a checkpoint's data record may ask for


def recorded_size(ckpt: dict, size, path) -> int:
    """The image size a checkpoint's data record gives, checked against the network: the
    family's native size (32 for the shipped ones), or the ``input_size`` an external network
    was built for; and at most FILE_MAX_IMAGE_SIZE, so that a forged number in a small file
    cannot make every 32x32 image thousands of pixels a side (a larger size is the user's to
    ask for with --image-size)."""
    options = ckpt.get("options") if isinstance(ckpt.get("options"), dict) else {}
    built = options.get("input_size")
    expected = native_size(ckpt.get("arch")) or (built[1] if isinstance(built, list) and len(built) == 3
                                                 and built[1] == built[2] else None)
    if expected is not None and size != expected:
        raise CheckpointError(f"{path}: its data record asks for images of {clip(size)} pixels a side, "
                              f"but its network takes {expected}x{expected}; give --image-size")
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= FILE_MAX_IMAGE_SIZE:
        raise CheckpointError(f"{path}: its data record asks for images of {clip(size)} pixels a side, "
                              f"not an integer from 1 to {FILE_MAX_IMAGE_SIZE}; give --image-size")
    return size


def _three_floats(v) -> bool:
    return isinstance(v, list) and len(v) == 3 and all(isinstance(x, float) and math.isfinite(x) for x in v)


def loaders(args, device: torch.device, dist: DistInfo | None = None, image_size: int | None = None):
    """The data the flags ask for; ``image_size`` is the network's own when it takes only one
    (the shipped CIFAR families: 32) and no --image-size was given."""
    dist = dist or DistInfo()
    if image_size is not None and args.image_size not in (None, image_size):
        raise SlimmingError(f"--image-size {args.image_size}: the paper's networks (vgg, nin, preresnet, "
                            f"densenet) take {image_size}x{image_size} images only; for another size use "
                            "--arch torchvision:NAME or timm:NAME", param="image_size")
    return build_loaders(args.dataset, args.data_root, args.batch_size, max(args.workers, 0),
                         args.download, getattr(args, "seed", None), device.type == "cuda",
                         loader=args.loader, device=device, rank=dist.rank,
                         world_size=dist.world_size, image_size=args.image_size or image_size,
                         norm=args.norm or "dataset", limit=getattr(args, "limit", None))


def native_size(arch: str | None) -> int | None:
    """The image side a family is built for (``input_size``: 32 for the CIFAR families, which
    take nothing else); None (the data decides) for any other network."""
    net = models.family(arch)
    return None if net is None else net.input_size[-1]


def data_record(args, train_loader) -> dict:
    """What a checkpoint records of the data it was trained on, so that eval, sweep and
    finetune can default to it: dataset, root, image size, resize recipe, mean and std."""
    record = {"dataset": args.dataset, "data_root": str(args.data_root) if args.data_root else None}
    info = getattr(train_loader, "info", None)
    return {**record, **info.as_dict()} if info is not None else record


def check_classes(ckpt: dict, path, num_classes: int) -> None:
    have = (ckpt.get("options") or {}).get("num_classes")
    if have is not None and have != num_classes:
        raise SlimmingError(f"{path} has {have} output classes but the dataset has {num_classes}: "
                            "choose the dataset it was trained on (--dataset, --data-root)")


def read_checkpoint(args, path: Path, device: torch.device | str = "cpu") -> tuple[dict, nn.Module]:
    """Load ``path`` and rebuild its network; ``--arch/--depth`` describe files written by the
    paper's own code, which do not say their architecture."""
    paper = {"arch": args.arch, "depth": args.depth} if getattr(args, "arch", None) else {}
    ckpt = load_checkpoint(path, map_location=device, **paper)
    return ckpt, model_from_checkpoint(ckpt, path)
