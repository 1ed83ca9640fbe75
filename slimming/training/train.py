"""Training runs, ``train`` and ``finetune`` alike: devices and torchrun, the run lock,
resuming, the data, the one loop (``engine.Trainer``), and starting from the user's weights."""

from __future__ import annotations

import contextlib
import json
import os
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..errors import CheckpointError, SlimmingError, first_line, load_error
from ..io.checkpoint import load_checkpoint, model_from_checkpoint, strip_prefix
from ..measure.stats import count_params
from ..models import describe_cfg
from ..utils.files import RunLock, sweep_temporaries, write_text
from ..utils.safeload import read_file
from .config import TrainConfig
from .distributed import cleanup, init_distributed
from .engine import AMP_DTYPES, Trainer, make_optimizer, make_scheduler
from .runs import (
    announce_device,
    check_classes,
    check_output,
    data_record,
    device_for,
    loaders,
    plain_args,
)
from .saver import CheckpointSaver
from .sparsity import Sparsity, SparsityController


def seed_everything(seed: int | None, deterministic: bool = False) -> None:
    """Seed Python and torch; ``deterministic`` also restricts torch to deterministic kernels
    (on CUDA that needs CUBLAS_WORKSPACE_CONFIG, set here unless the user set it)."""
    if deterministic:
        if seed is None:
            raise SlimmingError("deterministic needs seed N: a run is only repeatable from a seed",
                                param=("deterministic", "seed"))
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
    if seed is not None:
        random.seed(seed)
        torch.manual_seed(seed)


def resume_checkpoint(config: TrainConfig) -> dict | None:
    """The checkpoint ``config.resume`` points at (on the CPU); None to start fresh (``auto``
    with no last.pth)."""
    if config.resume is None:
        check_output(config.save / "last.pth", config.overwrite, resumable=True)
        return None
    path = config.save / "last.pth" if config.resume == "auto" else Path(config.resume)
    if config.resume == "auto" and not path.exists():
        check_output(path, config.overwrite)  # still refuse a save folder that is a file
        return None
    ckpt = load_checkpoint(path)
    if ckpt.get("optimizer") is None or ckpt.get("epoch") is None:
        what = "a pruned file" if ckpt.get("cfg_mask") is not None else "this file"
        raise SlimmingError(f"resume {path}: {what} has no training state (optimizer, epoch) to "
                            f"resume; train it further with: slimming finetune --checkpoint {path}",
                            param="resume")
    return ckpt


@dataclass
class TrainResult:
    """What ``train`` returns: the best test accuracy (%), the last epoch's metrics row (empty
    when the run had nothing left to do) and the folder holding the run's files."""

    best_acc: float
    last: dict
    folder: Path


MakeModel = Callable[[int, torch.device, dict], tuple[nn.Module, dict]]


def train(config: TrainConfig, model: nn.Module | MakeModel, *, native: int | None = None,
          record: dict | None = None, loss_fn: Callable | None = None) -> TrainResult:
    """Everything ``train`` and ``finetune`` share: devices, torchrun, data, resume, the loop.

    ``model``: the network to train (made by ``slimming.models.build``, so that its checkpoints
    rebuild it), or ``make_model(num_classes, device, data)`` giving it and extra checkpoint
    fields (``data``: what ``data_record`` says of the training data). ``native``: the only
    image size the network takes, if it has one (see ``native_size``). ``record``: what the
    checkpoints keep as the run's ``args`` (default: the config's fields). ``loss_fn``: the
    training loss (default: cross-entropy). Returns the best test accuracy, the last epoch's
    metrics and the folder. Rank 0 holds ``config.save``'s run lock from before it checks the
    folder (when the folder exists) until the end.
    """
    make_model = model if not isinstance(model, nn.Module) else _as_made(model)
    device = device_for(config)
    dist = init_distributed(device.type == "cuda")
    if dist.enabled and device.type == "cuda":
        device = torch.device("cuda", dist.local_rank)
    say = print if dist.is_main else (lambda *a, **k: None)
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    try:
        with contextlib.ExitStack() as held:
            locked = dist.is_main and config.save.is_dir()
            if locked:
                held.enter_context(RunLock(config.save))
            resumed = resume_checkpoint(config)
            if resumed is not None and resumed["epoch"] >= config.epochs:  # before loading any data
                say(f"nothing to do: {config.save} already holds {resumed['epoch']} of {config.epochs} "
                    "epochs")
                return TrainResult(float(resumed.get("best_acc") or 0.0), {}, config.save)
            seed_everything(config.seed, config.deterministic)
            train_loader, test_loader, num_classes = loaders(config, device, dist, native)
            data = data_record(config, train_loader)
            if resumed is None:
                model, extra = make_model(num_classes, device, data)
            else:  # the run's own checkpoint says what network it is
                model = model_from_checkpoint(resumed, config.resume)
                check_classes(resumed, config.resume, num_classes)
                extra = {k: resumed[k] for k in ("cfg_mask", "source") if k in resumed}
            extra["data"] = data
            model.to(device)
            if dist.is_main:
                announce_device(config, device)
            say(f"{model.arch} cfg {describe_cfg(model.cfg)}: {count_params(model):,} parameters, on {device}"
                + (f", {dist.world_size} processes" if dist.enabled else ""))
            trainer = make_trainer(config, model, device, dist, say, loss_fn)
            start_epoch, best_acc = 0, 0.0
            if resumed is not None:
                try:
                    trainer.load_state_dict(resumed)
                except (ValueError, KeyError, TypeError, IndexError, RuntimeError) as e:
                    raise CheckpointError(f"resume {config.resume}: its training state does not fit "
                                          f"this run ({first_line(e)})", param="resume") from None
                start_epoch, best_acc = resumed["epoch"], float(resumed.get("best_acc") or 0.0)
                say(f"resuming from epoch {start_epoch} (best test accuracy {best_acc:.2f}%)")
            saver = None
            if dist.is_main:
                if not locked:  # the folder did not exist: lock it as it is made
                    held.enter_context(RunLock(config.save))
                keep_metrics(config.save / "metrics.jsonl", start_epoch)
                sweep_temporaries(config.save)
                saver = CheckpointSaver(config.save, {"args": plain_args(config) if record is None
                                                      else record, **extra})
            result = trainer.fit(train_loader, test_loader, epochs=config.epochs, saver=saver,
                                 start_epoch=start_epoch, best_acc=best_acc, log=say)
            say(f"best test accuracy {result['best_acc']:.2f}%; checkpoints in {config.save}/ "
                "(best.pth, last.pth), metrics in metrics.jsonl")
            last = {k: v for k, v in result.items() if k != "best_acc"}
            return TrainResult(result["best_acc"], last, config.save)
    finally:
        torch.use_deterministic_algorithms(was_deterministic)  # leave the process as found
        cleanup()


def _as_made(model: nn.Module) -> MakeModel:
    def make_model(num_classes: int, device: torch.device, data: dict):
        classes = (getattr(model, "options", None) or {}).get("num_classes", num_classes)
        if classes != num_classes:
            raise SlimmingError(f"the model has {classes} output classes but the dataset has "
                                f"{num_classes}", param="dataset")
        return model, {}

    return make_model


def make_trainer(config: TrainConfig, model: nn.Module, device: torch.device, dist, say,
                 loss_fn: Callable | None = None) -> Trainer:
    """The ``Trainer`` of ``model`` (on ``device``) as ``config`` asks: memory format,
    SyncBatchNorm, optimizer and schedule, the sparsity term and its controller, DDP, compile,
    AMP."""
    if config.channels_last:
        model = model.to(memory_format=torch.channels_last)
    if config.sync_bn:
        if device.type == "cuda":
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        else:
            say("slimming: --sync-bn is CUDA-only in PyTorch; continuing with per-process "
                "BatchNorm", file=sys.stderr)
    optimizer = make_optimizer(model, config.opt, config.lr, config.momentum, config.weight_decay,
                               config.nesterov, config.no_wd_bn)
    scheduler = make_scheduler(optimizer, config.epochs, config.sched, config.warmup_epochs)
    sparsity = Sparsity(model, config.sparsity) if config.sparsity > 0 else None
    if sparsity is not None and config.opt == "adamw":
        say("slimming: --opt adamw divides the L1 term by each gradient's running size, so a gamma moves "
            "by at most about --lr a step whatever --sparsity says; sparsity training wants --opt sgd "
            "(the paper's)", file=sys.stderr)
    controller = SparsityController(config.sparsity_target) if config.sparsity_target and sparsity else None
    net = model
    if dist.enabled:
        net = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    if config.compile:
        net = torch.compile(net)
    amp_dtype = None
    if config.amp:
        amp_dtype = AMP_DTYPES[config.amp_dtype or ("float16" if device.type == "cuda" else "bfloat16")]
    return Trainer(net, optimizer, scheduler, device, sparsity=sparsity, amp_dtype=amp_dtype,
                   grad_clip=config.grad_clip, label_smoothing=config.label_smoothing,
                   channels_last=config.channels_last, dist=dist, controller=controller, loss_fn=loss_fn)


def keep_metrics(path: Path, epochs_done: int) -> None:
    """Drop metrics rows of epochs a resumed run will redo (all of them for a fresh run), and
    a last line that a kill cut short. A symlink planted there is not read (the first append
    replaces it with a file of our own)."""
    if not path.is_file() or path.is_symlink():
        return
    rows = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            epoch = json.loads(line)["epoch"]
            if isinstance(epoch, int) and epoch <= epochs_done:
                rows.append(line)
        except (ValueError, KeyError, TypeError):
            continue
    write_text(path, "".join(r + "\n" for r in rows))


def load_init(model: nn.Module, path: Path) -> None:
    """``init``: the user's own weights (a state_dict, or a file holding one under
    'state_dict' or 'model'), read safely and loaded strictly."""
    obj = read_file(path)
    state = obj
    if isinstance(obj, dict):
        state = next((obj[k] for k in ("state_dict", "model", "model_state_dict")
                      if isinstance(obj.get(k), dict)), obj)
    if not isinstance(state, dict) or not state or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        raise CheckpointError(f"init {path}: not a state_dict (a dict of named tensors, or a file "
                              "holding one under 'state_dict' or 'model')", param="init")
    try:
        model.load_state_dict(strip_prefix(state), strict=True)
    except RuntimeError as e:
        raise CheckpointError(f"init {path}: its weights do not fit {model.arch} "
                              f"({load_error(e)}); a different classifier needs num_classes",
                              param=("init", "num_classes")) from None
