"""What each subcommand does. ``cli.py`` parses the command line and turns mistakes into one
line; the functions here take the parsed arguments and do the work through the library."""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from .checkpoint import checkpoint_dict, load_checkpoint, model_from_checkpoint, save_checkpoint
from .distributed import DistInfo, cleanup, init_distributed
from .engine import AMP_DTYPES, NO_CUDA_NOTICE, resolve_device
from .prune import prune
from .stats import count_params


def plain_args(args: argparse.Namespace) -> dict:
    """The run's arguments as plain values, fit for a weights_only checkpoint."""
    out = {}
    for k, v in vars(args).items():
        if callable(v):
            continue
        out[k] = str(v) if isinstance(v, Path) else v
    return out


def check_output(path: Path, overwrite: bool, hint: str = "", flag: str = "--save") -> None:
    """Refuse to clobber an existing output, or to write where a file blocks the folder."""
    for parent in [path.parent, *path.parent.parents]:
        if parent.exists() and not parent.is_dir():
            raise ValueError(f"{parent} is a file, not a folder: choose another {flag}")
    existing = next(p for p in [path.parent, *path.parent.parents] if p.exists())
    try:  # a real probe: permission bits say nothing to root or on a read-only file system
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as e:
        raise ValueError(f"cannot write in {existing} ({e.strerror}): choose another {flag}") from None
    if path.exists() and not overwrite:
        raise ValueError(f"{path} already exists: pass --overwrite to replace it{hint}, or "
                         f"choose another {flag}")


def device_for(args) -> torch.device:
    """The run's device, chosen quietly: the CPU notice waits for ``announce_device``, so that a
    mistake found while setting up is the only line the user sees."""
    return resolve_device(args.device, args.cpu, quiet=True)


def announce_device(args, device: torch.device) -> None:
    if device.type == "cpu" and not args.cpu and args.device is None:
        print(NO_CUDA_NOTICE, file=sys.stderr)


def seed_everything(seed: int | None, deterministic: bool = False) -> None:
    """Seed Python and torch; ``deterministic`` also restricts torch to deterministic kernels
    (on CUDA that needs CUBLAS_WORKSPACE_CONFIG, set here unless the user set it)."""
    if deterministic:
        if seed is None:
            raise ValueError("--deterministic needs --seed N: a run is only repeatable from a seed")
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
    if seed is not None:
        random.seed(seed)
        torch.manual_seed(seed)


def loaders(args, device: torch.device, dist: DistInfo | None = None):
    from .data import build_loaders

    dist = dist or DistInfo()
    return build_loaders(args.dataset, args.data_root, args.batch_size, max(args.workers, 0),
                         args.download, getattr(args, "seed", None), device.type == "cuda",
                         loader=args.loader, device=device, rank=dist.rank,
                         world_size=dist.world_size)


def resume_checkpoint(args, device: torch.device) -> dict | None:
    """The checkpoint ``--resume`` points at; None to start fresh (``auto`` with no last.pth)."""
    if args.resume is None:
        check_output(args.save / "last.pth", args.overwrite, " or --resume auto to continue it")
        return None
    path = args.save / "last.pth" if args.resume == "auto" else Path(args.resume)
    if args.resume == "auto" and not path.exists():
        check_output(path, args.overwrite)  # still refuse a --save that is a file
        return None
    return load_checkpoint(path, map_location=device)


def run_training(args, make_model: Callable[[int, torch.device], tuple[nn.Module, dict]]) -> None:
    """Everything ``train`` and ``finetune`` share: devices, torchrun, data, resume, the loop.

    ``make_model(num_classes, device)`` gives the starting network and extra checkpoint fields.
    """
    from .engine import Trainer, make_optimizer, make_scheduler
    from .sparsity import BNSparsity

    if args.amp_dtype and not args.amp:
        raise ValueError("--amp-dtype only applies with --amp; add --amp")
    device = device_for(args)
    dist = init_distributed(device.type == "cuda")
    if dist.enabled and device.type == "cuda":
        device = torch.device("cuda", dist.local_rank)
    say = print if dist.is_main else (lambda *a, **k: None)
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    try:
        resumed = resume_checkpoint(args, device)
        if resumed is not None and int(resumed["epoch"]) >= args.epochs:  # before loading any data
            say(f"nothing to do: {args.save} already holds {resumed['epoch']} of {args.epochs} epochs")
            return
        seed_everything(args.seed, args.deterministic)
        train_loader, test_loader, num_classes = loaders(args, device, dist)
        if resumed is None:
            model, extra = make_model(num_classes, device)
        else:  # the run's own checkpoint says what network it is
            model = model_from_checkpoint(resumed, args.resume)
            check_classes(resumed, args.resume, num_classes)
            extra = {k: resumed[k] for k in ("cfg_mask", "source") if k in resumed}
        model.to(device)
        if dist.is_main:
            announce_device(args, device)
        say(f"{model.arch} cfg {model.cfg}: {count_params(model):,} parameters, on {device}"
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
            trainer.load_state_dict(resumed)
            start_epoch, best_acc = int(resumed["epoch"]), float(resumed.get("best_acc", 0.0))
            say(f"resuming from epoch {start_epoch} (best test accuracy {best_acc:.2f}%)")
        if dist.is_main:
            args.save.mkdir(parents=True, exist_ok=True)
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
    a last line that a kill cut short."""
    if not path.exists():
        return
    rows = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line)["epoch"] <= epochs_done:
                rows.append(line)
        except (ValueError, KeyError, TypeError):
            continue
    path.write_text("".join(r + "\n" for r in rows))


def sweep_temporaries(save: Path) -> None:
    """Remove the temporary files of checkpoint writes that a kill interrupted."""
    for p in save.glob(".*.pth.*.tmp"):
        p.unlink(missing_ok=True)


def cmd_train(args) -> None:
    import models

    def make_model(num_classes: int, device: torch.device):
        options = {"num_classes": num_classes}
        if args.depth is not None and args.cfg is None:
            options["depth"] = args.depth
        return models.build(args.arch, cfg=args.cfg, **options), {}

    run_training(args, make_model)


def read_checkpoint(args, path: Path, device: torch.device | str = "cpu") -> tuple[dict, nn.Module]:
    """Load ``path`` and rebuild its network; ``--arch/--depth`` describe files written by the
    paper's own code, which do not say their architecture."""
    paper = {"arch": args.arch, "depth": args.depth} if getattr(args, "arch", None) else {}
    ckpt = load_checkpoint(path, map_location=device, **paper)
    return ckpt, model_from_checkpoint(ckpt, path)


def check_classes(ckpt: dict, path, num_classes: int) -> None:
    have = (ckpt.get("options") or {}).get("num_classes")
    if have is not None and have != num_classes:
        raise ValueError(f"{path} has {have} output classes but the dataset has {num_classes}")


def load_for_data(args, num_classes: int, device: torch.device) -> tuple[dict, nn.Module]:
    ckpt, model = read_checkpoint(args, args.checkpoint, device)
    check_classes(ckpt, args.checkpoint, num_classes)
    return ckpt, model


def cmd_finetune(args) -> None:
    def make_model(num_classes: int, device: torch.device):
        ckpt, model = load_for_data(args, num_classes, device)
        source = {"path": str(args.checkpoint), "acc": ckpt.get("acc"),
                  "source_acc": ckpt.get("source_acc")}
        return model, {"cfg_mask": ckpt.get("cfg_mask"), "source": source}

    run_training(args, make_model)


def cmd_eval(args) -> dict:
    device = device_for(args)
    from .engine import evaluate

    _, test_loader, num_classes = loaders(args, device)
    _, model = load_for_data(args, num_classes, device)
    announce_device(args, device)
    m = evaluate(model.to(device), test_loader, device)
    print(f"{args.checkpoint}: top-1 accuracy {m['acc']:.2f}%  loss {m['loss']:.4f}  "
          f"({m['count']} test images, {count_params(model):,} parameters)")
    return m


def cmd_prune(args) -> None:
    out = args.save / "pruned.pth"
    check_output(out, args.overwrite)
    ckpt, model = read_checkpoint(args, args.checkpoint)
    result = prune(model, percent=args.percent, threshold=args.threshold,
                   min_channels=args.min_channels)
    table = result.layer_table()
    if all(before == after for _, before, after in table):
        how = f"--percent {args.percent}" if args.percent is not None else f"--threshold {args.threshold}"
        raise ValueError(f"{how} prunes no channel (smallest prunable |gamma| "
                         f"{min_gamma(model):.4g}): nothing to save; raise it")
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
    print(f"cfg {result.cfg}")
    save_checkpoint(checkpoint_dict(result.model, cfg_mask=result.cfg_mask,
                                    threshold=result.threshold, percent=args.percent,
                                    source_acc=ckpt.get("acc"),
                                    source={"path": str(args.checkpoint),
                                            "acc": ckpt.get("acc"), "epoch": ckpt.get("epoch")},
                                    args=plain_args(args)), out)
    print(f"saved {out}")


def min_gamma(model: nn.Module) -> float:
    from .prune import prunable_bns

    return min(bn.weight.detach().abs().min().item() for bn in prunable_bns(model))


def cmd_stats(args) -> None:
    from .stats import format_stats, model_stats

    device = device_for(args)
    paths = [args.checkpoint] + ([args.compare] if args.compare else [])
    results = []
    for path in paths:
        _, model = read_checkpoint(args, path, device)
        results.append(model_stats(model.to(device).eval(), args.input_size, repeats=args.repeats))
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
    _, test_loader, num_classes = loaders(args, device)
    _, model = load_for_data(args, num_classes, device)
    announce_device(args, device)
    rows = sweep(model.to(device).eval(), test_loader, device, percents, args.min_channels)
    for r in rows:
        print(f"percent {r['percent']:<5g} params kept {100 * r['params_kept']:5.1f}%  FLOPs kept "
              f"{100 * r['flops_kept']:5.1f}%  top-1 {r['acc']:.2f}%")
    written = write_sweep(rows, args.save)
    print("wrote " + ", ".join(str(p) for p in written))


def cmd_export(args) -> None:
    from .export import export_model

    check_output(args.out, args.overwrite, flag="--out")
    _, model = read_checkpoint(args, args.checkpoint)
    diff = export_model(model, args.out, args.format, args.input_size, atol=args.atol)
    print(f"exported {args.out} ({args.format}); largest difference from PyTorch on a random "
          f"batch: {diff:.3g} (tolerance {args.atol:g})")


def cmd_report(args) -> None:
    from . import plots
    from .report import build_report, write_report

    written = write_report(build_report(args.run, args.repeats), args.run)
    print("wrote " + ", ".join(str(p) for p in written))
    if not plots.available():
        print(f"text only: {plots.MISSING}")


def cmd_pipeline(args) -> None:
    """Sparsity training -> prune -> fine-tune -> report, each stage in its own sub-folder of
    --save; rerun the same command to pick up where it stopped (finished stages are skipped)."""
    import copy

    root = args.save
    check_output(root / "x", False)  # only refuses a --save that is a file

    def stage(name: str, **changes) -> argparse.Namespace:
        ns = copy.copy(args)
        ns.save, ns.resume, ns.overwrite = root / name, "auto", False
        for k, v in changes.items():
            setattr(ns, k, v)
        return ns

    if args.baseline:
        print("== baseline (no sparsity) ==")
        cmd_train(stage("baseline", sparsity=0.0))
    print("== sparsity training ==")
    cmd_train(stage("sparse"))
    pruned = root / "pruned" / "pruned.pth"
    print("== prune ==")
    if pruned.exists():
        print(f"{pruned} exists: skipping")
    else:
        source = root / "sparse" / "best.pth"
        cmd_prune(stage("pruned", checkpoint=source, arch=None, depth=None))
    evaluated = root / "pruned" / "eval.json"
    if not evaluated.exists():
        m = cmd_eval(stage("pruned", checkpoint=pruned, arch=None, depth=None))
        evaluated.write_text(json.dumps({"acc": m["acc"], "loss": m["loss"], "count": m["count"]}))
    print("== fine-tune ==")
    cmd_finetune(stage("finetuned", checkpoint=pruned, arch=None, depth=None, sparsity=0.0,
                       epochs=args.finetune_epochs or args.epochs,
                       lr=args.finetune_lr or args.lr))
    print("== report ==")
    cmd_report(argparse.Namespace(run=root, repeats=args.repeats))
