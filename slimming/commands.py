"""What each subcommand does. ``cli.py`` parses the command line and turns mistakes into one
line; the functions here take the parsed arguments and do the work through the library.
``slimming pipeline`` lives in ``pipeline.py``."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from models import describe_cfg

from . import devices
from .checkpoint import checkpoint_dict, load_checkpoint, model_from_checkpoint, save_checkpoint
from .distributed import DistInfo, cleanup, init_distributed
from .engine import AMP_DTYPES
from .errors import CheckpointError, SlimmingError, first_line
from .files import RunLock, sweep_temporaries, write_text
from .prune import prunable_bns, prune
from .stats import count_params

DEVICE_FLAGS = ("cpu", "device")  # how a file was made, not what it holds: not recorded in it
SPARSE_BOUND = 1e-2  # |gamma| under this counts as "pruned away by sparsity training"
new_command = devices.new_command


def plain_args(args: argparse.Namespace, leave_out: tuple[str, ...] = ()) -> dict:
    """The run's arguments as plain values, fit for a weights_only checkpoint."""
    out = {}
    for k, v in vars(args).items():
        if callable(v) or k in leave_out:
            continue
        out[k] = str(v) if isinstance(v, Path) else v
    return out


def check_output(path: Path, overwrite: bool, hint: str = "", flag: str = "--save") -> None:
    """Refuse to clobber an existing output, or to write where a file blocks the folder."""
    for parent in [path.parent, *path.parent.parents]:
        if parent.exists() and not parent.is_dir():
            raise SlimmingError(f"{parent} is a file, not a folder: choose another {flag}")
    existing = next(p for p in [path.parent, *path.parent.parents] if p.exists())
    try:  # a real probe: permission bits say nothing to root or on a read-only file system
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as e:
        raise SlimmingError(f"cannot write in {existing} ({e.strerror}): choose another {flag}") from None
    if path.is_dir():
        raise SlimmingError(f"{path} is a folder: choose another {flag}")
    if (path.exists() or path.is_symlink()) and not overwrite:
        raise SlimmingError(f"{path} already exists: pass --overwrite to replace it{hint}, or "
                            f"choose another {flag}")


def device_for(args) -> torch.device:
    """The run's device, chosen quietly: the CPU notice waits for ``announce_device``, so that a
    mistake found while setting up is the only line the user sees."""
    return devices.resolve_device(args.device, args.cpu)


def announce_device(args, device: torch.device) -> None:
    devices.announce(device, chosen=args.cpu or args.device is not None)


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


# --------------------------------------------------------------------------- data

def trained_on(ckpt: dict) -> dict:
    """``{"dataset", "data_root"}`` the checkpoint was trained on, when it says (a ``data``
    field, written by prune, or the training run's own ``args``); {} otherwise."""
    from .data import DATASETS

    for source in (ckpt.get("data"), ckpt.get("args")):
        if isinstance(source, dict) and source.get("dataset") in DATASETS:
            root = source.get("data_root")
            return {"dataset": source["dataset"], "data_root": root if isinstance(root, str) else None}
    return {}


def default_data(args, ckpt: dict) -> None:
    """Data flags not given: the checkpoint's (dataset, root, image size, normalisation), else
    cifar10. An image-folder checkpoint from before slimming measured a folder's own mean and
    std was normalised with CIFAR-10's: it gets those again."""
    from .data import STATS

    known = trained_on(ckpt)
    same = args.dataset is None or args.dataset == known.get("dataset")
    if args.dataset is None:
        args.dataset = known.get("dataset", "cifar10")
    if args.data_root is None and same and known.get("data_root"):
        args.data_root = Path(known["data_root"])
    record = ckpt.get("data") if isinstance(ckpt.get("data"), dict) else {}
    if args.image_size is None and same and isinstance(record.get("image_size"), int):
        args.image_size = record["image_size"]
    if args.norm is None and same:
        mean, std = record.get("mean"), record.get("std")
        if _three_floats(mean) and _three_floats(std):
            args.norm = (tuple(mean), tuple(std))
        elif args.dataset == "imagefolder" and known:
            args.norm = STATS["cifar10"]


def _three_floats(v) -> bool:
    return isinstance(v, list) and len(v) == 3 and all(isinstance(x, float) and math.isfinite(x) for x in v)


def loaders(args, device: torch.device, dist: DistInfo | None = None, image_size: int | None = None):
    """The data the flags ask for; ``image_size`` is the network's own when it takes only one
    (the shipped CIFAR families: 32) and no --image-size was given."""
    from .data import build_loaders

    dist = dist or DistInfo()
    return build_loaders(args.dataset, args.data_root, args.batch_size, max(args.workers, 0),
                         args.download, getattr(args, "seed", None), device.type == "cuda",
                         loader=args.loader, device=device, rank=dist.rank,
                         world_size=dist.world_size, image_size=args.image_size or image_size,
                         norm=args.norm or "dataset")


def native_size(arch: str | None) -> int | None:
    """32 for the shipped CIFAR families (they take nothing else); None (the data decides)
    for any other network."""
    import models

    return 32 if arch in models.ARCHS else None


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


# --------------------------------------------------------------------------- train, finetune

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
    from .sparsity import BNSparsity

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
                              channels_last=args.channels_last, dist=dist)
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


def cmd_train(args) -> None:
    import models

    def make_model(num_classes: int, device: torch.device, data: dict):
        if args.num_classes is not None and args.num_classes != num_classes:
            raise SlimmingError(f"--num-classes {args.num_classes}, but the dataset has "
                                f"{num_classes} classes")
        if models.external.is_external(args.arch):
            size = data.get("image_size") or 32
            model = models.build(args.arch, num_classes=num_classes, kwargs=args.model_kwargs,
                                 input_size=[3, size, size])
        else:
            options = {"num_classes": num_classes}
            if args.depth is not None and args.cfg is None:
                options["depth"] = args.depth
            model = models.build(args.arch, cfg=args.cfg, **options)
        if args.init is not None:
            load_init(model, args.init)
        return model, {}

    run_training(args, make_model, native_size(args.arch))


def cmd_finetune(args) -> None:
    ckpt, model = read_checkpoint(args, args.checkpoint)  # on the CPU; the run moves it
    default_data(args, ckpt)

    def make_model(num_classes: int, device: torch.device, data: dict):
        check_classes(ckpt, args.checkpoint, num_classes)
        source = {"path": str(args.checkpoint), "acc": ckpt.get("acc"),
                  "source_acc": ckpt.get("source_acc")}
        return model, {"cfg_mask": ckpt.get("cfg_mask"), "source": source}

    run_training(args, make_model, native_size(ckpt["arch"]))


# --------------------------------------------------------------------------- the other commands

def cmd_eval(args) -> dict:
    from .engine import evaluate

    device = device_for(args)
    ckpt, model = read_checkpoint(args, args.checkpoint, device)
    default_data(args, ckpt)
    _, test_loader, num_classes = loaders(args, device, image_size=native_size(ckpt["arch"]))
    check_classes(ckpt, args.checkpoint, num_classes)
    announce_device(args, device)
    m = evaluate(model.to(device), test_loader, device)
    print(f"{args.checkpoint}: top-1 accuracy {m['acc']:.2f}%  loss {m['loss']:.4f}  "
          f"({m['count']} test images of {args.dataset}, {count_params(model):,} parameters)")
    return m


def prune_warnings(model: nn.Module, result, min_channels: int) -> list[str]:
    """What to say before a fine-tune is spent on a pruning that cannot work well: layers the
    guard refilled, and a model whose gammas show no sparsity."""
    notes = []
    if result.guarded:
        names = ", ".join(result.guarded[:6]) + (", ..." if len(result.guarded) > 6 else "")
        notes.append(f"{len(result.guarded)} layer(s) fell to the --min-channels guard and keep "
                     f"only their {min_channels} largest-|gamma| channel(s): {names}; that can "
                     "cost much accuracy: try a smaller --percent")
    gammas = torch.cat([bn.weight.detach().abs().float().cpu() for bn in prunable_bns(model)])
    near_zero = (gammas < SPARSE_BOUND).float().mean().item()
    cut = sum(b - a for _, b, a in result.layer_table()) / max(gammas.numel(), 1)
    if near_zero < cut / 2:
        notes.append(f"only {100 * near_zero:.1f}% of prunable |gamma| are under {SPARSE_BOUND:g} but "
                     f"{100 * cut:.1f}% of the channels are cut: the model shows little sparsity, "
                     "so this cuts channels that still matter; sparsity training comes first "
                     "(slimming train --sparsity 1e-4 ...)")
    return notes


def cmd_prune(args) -> None:
    out = args.save / "pruned.pth"
    check_output(out, args.overwrite)
    device = device_for(args)
    ckpt, model = read_checkpoint(args, args.checkpoint, device)
    result = prune(model, percent=args.percent, threshold=args.threshold,
                   min_channels=args.min_channels)  # rebuilt and filled on ``device``
    table = result.layer_table()
    if all(before == after for _, before, after in table):
        how = f"--percent {args.percent}" if args.percent is not None else f"--threshold {args.threshold}"
        smallest = min(bn.weight.detach().abs().min().item() for bn in prunable_bns(model))
        raise SlimmingError(f"{how} prunes no channel (smallest prunable |gamma| {smallest:.4g}): "
                            "nothing to save; raise it")
    announce_device(args, device)
    width = max(len(n) for n, _, _ in table)
    print(f"{'layer':<{width}}  before  after")
    for name, before, after in table:
        print(f"{name:<{width}}  {before:>6}  {after:>5}")
    before = sum(b for _, b, _ in table)
    after = sum(a for _, _, a in table)
    p0, p1 = count_params(model), count_params(result.model)
    thr = "none" if result.threshold is None else f"{result.threshold:.4g}"
    print(f"channels {before} -> {after} ({100 * (before - after) / before:.1f}% removed; "
          f"|gamma| threshold {thr})")
    print(f"parameters {p0:,} -> {p1:,} ({100 * p1 / p0:.1f}% kept)")
    if isinstance(result.cfg, dict):  # a traced network: its widths per BatchNorm, in the file
        changed = sum(1 for _, b, a in table if a != b)
        print(f"widths of {changed} of {len(table)} BatchNorm layers changed (the file's cfg)")
    else:
        print(f"cfg {result.cfg}")
    for note in prune_warnings(model, result, args.min_channels):
        print(f"slimming prune: warning: {note}", file=sys.stderr)
    source = {"path": str(args.checkpoint), "acc": ckpt.get("acc"), "epoch": ckpt.get("epoch")}
    save_checkpoint(checkpoint_dict(result.model, cfg_mask=result.cfg_mask, threshold=result.threshold,
                                    percent=args.percent, source_acc=ckpt.get("acc"), source=source,
                                    data=trained_on(ckpt) or None,
                                    args=plain_args(args, leave_out=DEVICE_FLAGS)), out)
    print(f"saved {out}")


def input_size_of(model: nn.Module) -> tuple[int, ...]:
    """The (C, H, W) the model was trained at, when it says; else CIFAR's 3x32x32."""
    return tuple(getattr(model, "input_size", None) or (3, 32, 32))


def cmd_stats(args) -> None:
    from .stats import check_input_size, format_stats, model_stats

    device = device_for(args)
    paths = [args.checkpoint] + ([args.compare] if args.compare else [])
    loaded = [read_checkpoint(args, path, device)[1] for path in paths]
    size = args.input_size or input_size_of(loaded[0])
    for model in loaded:
        check_input_size(model, size)
    announce_device(args, device)
    results = [model_stats(model.to(device).eval(), size, repeats=args.repeats) for model in loaded]
    if args.json:
        print(json.dumps({str(p): r for p, r in zip(paths, results)}, indent=1))
        return
    print(f"checkpoint: {args.checkpoint}" + (f"\ncompare:    {args.compare}" if args.compare else ""))
    print(f"on {device}; FLOPs count a multiply-add as two (torch.utils.flop_counter); latency: "
          f"median of {args.repeats} runs under torch.inference_mode")
    print(format_stats(results[0], results[1] if args.compare else None, ("checkpoint", "compare")))


def cmd_sweep(args) -> None:
    from .sweep import parse_percents, sweep, write_sweep

    percents = parse_percents(args.percents)
    check_output(args.save / "sweep.csv", False)
    device = device_for(args)
    ckpt, model = read_checkpoint(args, args.checkpoint, device)
    default_data(args, ckpt)
    _, test_loader, num_classes = loaders(args, device, image_size=native_size(ckpt["arch"]))
    check_classes(ckpt, args.checkpoint, num_classes)
    announce_device(args, device)
    rows = sweep(model.to(device).eval(), test_loader, device, percents, args.min_channels)
    for r in rows:
        what = "unpruned     " if r.get("reference") else f"percent {r['percent']:<5g}"
        print(f"{what} params kept {100 * r['params_kept']:5.1f}%  FLOPs kept "
              f"{100 * r['flops_kept']:5.1f}%  top-1 {r['acc']:.2f}%")
    written = write_sweep(rows, args.save)
    print("wrote " + ", ".join(str(p) for p in written))


def cmd_export(args) -> None:
    from .export import export_model
    from .stats import check_input_size

    check_output(args.out, args.overwrite, flag="--out")
    device = device_for(args)
    _, model = read_checkpoint(args, args.checkpoint, device)
    size = args.input_size or input_size_of(model)
    check_input_size(model, size)
    diff = export_model(model, args.out, args.format, size, atol=args.atol)
    announce_device(args, device)
    print(f"exported {args.out} ({args.format}, on {device}); largest difference from PyTorch on "
          f"a random batch: {diff:.3g} (tolerance {args.atol:g})")


def cmd_report(args) -> None:
    from . import plots
    from .report import build_report, write_report

    device = device_for(args)
    report = build_report(args.run, args.repeats, device, getattr(args, "arch", None))
    announce_device(args, device)
    written = write_report(report, args.run)
    print("wrote " + ", ".join(str(p) for p in written))
    if not plots.available():
        print(f"text only: {plots.MISSING}")


def cmd_pipeline(args) -> None:
    from .pipeline import run_pipeline

    run_pipeline(args)
