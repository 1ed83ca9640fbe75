"""Training runs, ``train`` and ``finetune`` alike: devices and torchrun, the run lock,
resuming, the data, the one loop (``engine.Trainer``), and starting from the user's weights."""

from __future__ import annotations

import contextlib
import json
import os
import random
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from .checkpoint import load_checkpoint, model_from_checkpoint
from .distributed import cleanup, init_distributed
from .engine import AMP_DTYPES
from .errors import CheckpointError, SlimmingError, first_line
from .files import RunLock, sweep_temporaries, write_text
from .models import describe_cfg
from .runs import announce_device, check_classes, check_output, data_record, device_for, loaders, plain_args
from .stats import count_params


def seed_everything(seed: int | None, deterministic: bool = False) -> None:
    """Seed Python and torch; ``deterministic`` also restricts torch to deterministic kernels
    (on CUDA that needs CUBLAS_WORKSPACE_CONFIG, set here unless the user set it)."""
    if deterministic:
        if seed is None:
            raise SlimmingError("--deterministic needs --seed N: a run is only repeatable from a seed")
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
    if seed is not None:
        random.seed(seed)
        torch.manual_seed(seed)


def resume_checkpoint(args) -> dict | None:
    """The checkpoint ``--resume`` points at (on the CPU); None to start fresh (``auto`` with no
    last.pth)."""
    if args.resume is None:
        check_output(args.save / "last.pth", args.overwrite, " or --resume auto to continue it")
        return None
    path = args.save / "last.pth" if args.resume == "auto" else Path(args.resume)
    if args.resume == "auto" and not path.exists():
        check_output(path, args.overwrite)  # still refuse a --save that is a file
        return None
    ckpt = load_checkpoint(path)
    if ckpt.get("optimizer") is None or ckpt.get("epoch") is None:
        what = "a pruned file" if ckpt.get("cfg_mask") is not None else "this file"
        raise SlimmingError(f"--resume {path}: {what} has no training state (optimizer, epoch) to "
                            f"resume; train it further with: slimming finetune --checkpoint {path}")
    return ckpt


def run_training(args, make_model: Callable[[int, torch.device, dict], tuple[nn.Module, dict]],
                 native: int | None = None) -> None:
    """Everything ``train`` and ``finetune`` share: devices, torchrun, data, resume, the loop.

    ``make_model(num_classes, device, data)`` gives the starting network and extra checkpoint
    fields (``data``: what ``data_record`` says of the training data). ``native``: the only
    image size the network takes, if it has one (see ``native_size``).
    Rank 0 holds the ``--save`` folder's run lock from before it checks the folder (when the
    folder exists) until the end.
    """
    from .engine import Trainer, make_optimizer, make_scheduler
    from .sparsity import BNSparsity, SparsityController

    device = device_for(args)
    dist = init_distributed(device.type == "cuda")
    if dist.enabled and device.type == "cuda":
        device = torch.device("cuda", dist.local_rank)
    say = print if dist.is_main else (lambda *a, **k: None)
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    try:
        with contextlib.ExitStack() as held:
            locked = dist.is_main and args.save.is_dir()
            if locked:
                held.enter_context(RunLock(args.save))
            resumed = resume_checkpoint(args)
            if resumed is not None and resumed["epoch"] >= args.epochs:  # before loading any data
                say(f"nothing to do: {args.save} already holds {resumed['epoch']} of {args.epochs} epochs")
                return
            seed_everything(args.seed, args.deterministic)
            train_loader, test_loader, num_classes = loaders(args, device, dist, native)
            data = data_record(args, train_loader)
            if resumed is None:
                model, extra = make_model(num_classes, device, data)
            else:  # the run's own checkpoint says what network it is
                model = model_from_checkpoint(resumed, args.resume)
                check_classes(resumed, args.resume, num_classes)
                extra = {k: resumed[k] for k in ("cfg_mask", "source") if k in resumed}
            extra["data"] = data
            model.to(device)
            if dist.is_main:
                announce_device(args, device)
            say(f"{model.arch} cfg {describe_cfg(model.cfg)}: {count_params(model):,} parameters, on {device}"
                + (f", {dist.world_size} processes" if dist.enabled else ""))
            if args.channels_last:
                model = model.to(memory_format=torch.channels_last)
            if args.sync_bn:
                if device.type == "cuda":
                    model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
                else:
                    say("slimming: --sync-bn is CUDA-only in PyTorch; continuing with per-process "
                        "BatchNorm", file=sys.stderr)
            optimizer = make_optimizer(model, args.opt, args.lr, args.momentum, args.weight_decay,
                                       args.nesterov, args.no_wd_bn)
            scheduler = make_scheduler(optimizer, args.epochs, args.sched, args.warmup_epochs)
            sparsity = BNSparsity(model, args.sparsity) if args.sparsity > 0 else None
            controller = (SparsityController(args.sparsity_target)
                          if getattr(args, "sparsity_target", None) and sparsity else None)
            net = model
            if dist.enabled:
                net = nn.parallel.DistributedDataParallel(
                    model, device_ids=[device.index] if device.type == "cuda" else None)
            if args.compile:
                net = torch.compile(net)
            amp_dtype = None
            if args.amp:
                amp_dtype = AMP_DTYPES[args.amp_dtype or ("float16" if device.type == "cuda" else "bfloat16")]
            trainer = Trainer(net, optimizer, scheduler, device, sparsity=sparsity, amp_dtype=amp_dtype,
                              grad_clip=args.grad_clip, label_smoothing=args.label_smoothing,
                              channels_last=args.channels_last, dist=dist, controller=controller)
            start_epoch, best_acc = 0, 0.0
            if resumed is not None:
                try:
                    trainer.load_state_dict(resumed)
                except (ValueError, KeyError, TypeError, IndexError, RuntimeError) as e:
                    raise CheckpointError(f"--resume {args.resume}: its training state does not fit "
                                          f"this run ({first_line(e)})") from None
                start_epoch, best_acc = resumed["epoch"], float(resumed.get("best_acc") or 0.0)
                say(f"resuming from epoch {start_epoch} (best test accuracy {best_acc:.2f}%)")
            if dist.is_main:
                if not locked:  # the folder did not exist: lock it as it is made
                    held.enter_context(RunLock(args.save))
                keep_metrics(args.save / "metrics.jsonl", start_epoch)
                sweep_temporaries(args.save)
            result = trainer.fit(train_loader, test_loader, epochs=args.epochs, save_dir=args.save,
                                 start_epoch=start_epoch, best_acc=best_acc,
                                 extra={"args": plain_args(args), **extra}, log=say)
            say(f"best test accuracy {result['best_acc']:.2f}%; checkpoints in {args.save}/ "
                "(best.pth, last.pth), metrics in metrics.jsonl")
    finally:
        torch.use_deterministic_algorithms(was_deterministic)  # leave the process as found
        cleanup()


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
    """``--init PATH``: the user's own weights (a state_dict, or a file holding one under
    'state_dict' or 'model'), read safely and loaded strictly."""
    from .checkpoint import strip_prefix
    from .safeload import read_file

    obj = read_file(path)
    state = obj
    if isinstance(obj, dict):
        state = next((obj[k] for k in ("state_dict", "model", "model_state_dict")
                      if isinstance(obj.get(k), dict)), obj)
    if not isinstance(state, dict) or not state or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        raise CheckpointError(f"--init {path}: not a state_dict (a dict of named tensors, or a file "
                              "holding one under 'state_dict' or 'model')")
    try:
        model.load_state_dict(strip_prefix(state), strict=True)
    except RuntimeError as e:
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        detail = lines[1] if len(lines) > 1 else first_line(e)
        raise CheckpointError(f"--init {path}: its weights do not fit {model.arch} "
                              f"({detail[:200]}); a different classifier needs --num-classes") from None
