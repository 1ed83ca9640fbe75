"""Command line: ``slimming train | prune | finetune | eval``. A thin layer over the library
that turns user mistakes into one line on stderr and exit code 2."""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from .checkpoint import (
    CheckpointError,
    checkpoint_dict,
    load_checkpoint,
    model_from_checkpoint,
    save_checkpoint,
)
from .distributed import DistInfo, cleanup, init_distributed
from .engine import AMP_DTYPES, NO_CUDA_NOTICE, TrainingError, resolve_device
from .prune import count_params, prune


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not usage + error
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _number(kind, low, low_ok: bool, what: str):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value < low or (value == low and not low_ok):
            raise argparse.ArgumentTypeError(f"{text} is not {what}")
        return value
    return parse


positive_int = _number(int, 1, True, "a positive integer")
positive_float = _number(float, 0.0, False, "positive")
nonneg_float = _number(float, 0.0, True, ">= 0")


def parse_cfg(text: str) -> list:
    """``16,M,32`` -> [16, 'M', 32]."""
    out: list = []
    for tok in text.split(","):
        tok = tok.strip()
        if tok.upper() == "M":
            out.append("M")
        elif tok.isdigit() and int(tok) > 0:
            out.append(int(tok))
        else:
            raise argparse.ArgumentTypeError(f"bad cfg entry {tok!r}: use positive widths and M")
    return out


def add_device_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cpu", action="store_true", help="run on the CPU even if CUDA is available")
    p.add_argument("--device", default=None, help="torch device, e.g. cuda:1 (default: cuda if "
                   "available, else cpu)")


def add_data_flags(p: argparse.ArgumentParser, dataset_default: str | None = "cifar10") -> None:
    from .data import DATASETS

    p.add_argument("--dataset", default=dataset_default, choices=DATASETS)
    p.add_argument("--data-root", type=Path, default=None,
                   help="dataset folder (default: ~/.cache/slimming/data; for imagefolder a "
                   "folder with train/<class>/* and test/<class>/*)")
    p.add_argument("--download", action="store_true", help="download CIFAR if it is missing")
    p.add_argument("--batch-size", type=positive_int, default=64, help="per process (default 64)")
    p.add_argument("--loader", choices=("fast", "torchvision"), default="fast",
                   help="fast: decoded images held in memory (on the GPU when training there), "
                   "augmented a whole batch at a time; torchvision: Dataset + DataLoader")
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers (torchvision loader)")


def add_training_flags(p: argparse.ArgumentParser, epochs: int) -> None:
    add_data_flags(p)
    p.add_argument("--config", type=Path, metavar="FILE.yaml",
                   help="YAML file whose keys are long flag names; command-line flags override it")
    p.add_argument("--epochs", type=positive_int, default=epochs)
    p.add_argument("--opt", choices=("sgd", "adamw"), default="sgd")
    p.add_argument("--lr", type=positive_float, default=0.1)
    p.add_argument("--momentum", type=_number(float, 0.0, True, ">= 0"), default=0.9)
    p.add_argument("--nesterov", action="store_true")
    p.add_argument("--weight-decay", type=nonneg_float, default=1e-4)
    p.add_argument("--no-wd-bn", action="store_true", help="no weight decay on BN weights/biases")
    p.add_argument("--sched", choices=("step", "cosine"), default="step",
                   help="step: x0.1 at 50%% and 75%% of the epochs (the paper's); cosine")
    p.add_argument("--warmup-epochs", type=_number(int, 0, True, ">= 0"), default=0)
    p.add_argument("--label-smoothing", type=_number(float, 0.0, True, ">= 0"), default=0.0)
    p.add_argument("--grad-clip", type=nonneg_float, default=0.0, metavar="NORM",
                   help="clip the gradient norm (0 = off)")
    p.add_argument("--sparsity", type=nonneg_float, default=0.0, metavar="S",
                   help="L1 strength on BN gammas (0 = off; the paper uses 1e-4 for VGG)")
    p.add_argument("--amp", action="store_true", help="mixed precision with torch.autocast")
    p.add_argument("--amp-dtype", choices=tuple(AMP_DTYPES), default=None,
                   help="default: float16 on CUDA (with GradScaler), bfloat16 on the CPU")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--sync-bn", action="store_true", help="SyncBatchNorm across GPUs (CUDA only)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--save", type=Path, required=True, metavar="DIR",
                   help="folder for last.pth, best.pth and metrics.jsonl")
    p.add_argument("--resume", default=None, metavar="PATH|auto",
                   help="continue a run: a checkpoint, or auto = DIR/last.pth if it exists")
    p.add_argument("--overwrite", action="store_true", help="replace a run already in --save")
    add_device_flags(p)


def build_parser() -> Parser:
    parser = Parser(prog="slimming", description="Network slimming for PyTorch: sparsity "
                    "training, channel pruning and fine-tuning.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    p = sub.add_parser("train", help="train from scratch, with --sparsity S for slimming")
    p.add_argument("--arch", default="vgg", help="nin or vgg")
    p.add_argument("--depth", type=int, default=19, help="VGG depth: 11, 13, 16 or 19")
    p.add_argument("--cfg", type=parse_cfg, default=None,
                   help="custom widths, e.g. 16,M,32,M,64,64,M,128,128,M,128,128")
    add_training_flags(p, epochs=160)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("prune", help="cut low-|gamma| channels of a checkpoint")
    p.add_argument("--checkpoint", type=Path, required=True)
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--percent", type=float, help="fraction of prunable channels to remove, "
                     "in [0, 1)")
    how.add_argument("--threshold", type=float, help="remove channels with |gamma| <= T")
    p.add_argument("--min-channels", type=positive_int, default=1,
                   help="channels every layer keeps at least (default 1)")
    p.add_argument("--save", type=Path, required=True, metavar="DIR", help="writes DIR/pruned.pth")
    p.add_argument("--overwrite", action="store_true", help="replace an existing pruned.pth")
    p.set_defaults(func=cmd_prune)

    p = sub.add_parser("finetune", help="train a pruned checkpoint further (sparsity off)")
    p.add_argument("--checkpoint", type=Path, required=True)
    add_training_flags(p, epochs=160)
    p.set_defaults(func=cmd_finetune)

    p = sub.add_parser("eval", help="top-1 accuracy and loss of a checkpoint on a test split")
    p.add_argument("--checkpoint", type=Path, required=True)
    add_data_flags(p)
    add_device_flags(p)
    p.set_defaults(func=cmd_eval)
    return parser


def plain_args(args: argparse.Namespace) -> dict:
    """The run's arguments as plain values, fit for a weights_only checkpoint."""
    out = {}
    for k, v in vars(args).items():
        if callable(v):
            continue
        out[k] = str(v) if isinstance(v, Path) else v
    return out


def check_output(path: Path, overwrite: bool, hint: str = "") -> None:
    """Refuse to clobber an existing output, or to write where a file blocks the folder."""
    for parent in [path.parent, *path.parent.parents]:
        if parent.exists() and not parent.is_dir():
            raise ValueError(f"{parent} is a file, not a folder: choose another --save")
    if path.exists() and not overwrite:
        raise ValueError(f"{path} already exists: pass --overwrite to replace it{hint}, or "
                         "choose another --save")


def device_for(args) -> torch.device:
    """The run's device, chosen quietly: the CPU notice waits for ``announce_device``, so that a
    mistake found while setting up is the only line the user sees."""
    return resolve_device(args.device, args.cpu, quiet=True)


def announce_device(args, device: torch.device) -> None:
    if device.type == "cpu" and not args.cpu and args.device is None:
        print(NO_CUDA_NOTICE, file=sys.stderr)


def seed_everything(seed: int | None) -> None:
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

    device = device_for(args)
    dist = init_distributed(device.type == "cuda")
    if dist.enabled and device.type == "cuda":
        device = torch.device("cuda", dist.local_rank)
    say = print if dist.is_main else (lambda *a, **k: None)
    try:
        resumed = resume_checkpoint(args, device)
        seed_everything(args.seed)
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
        if start_epoch >= args.epochs:
            say(f"nothing to do: {args.save} already holds {start_epoch} of {args.epochs} epochs")
            return
        result = trainer.fit(train_loader, test_loader, epochs=args.epochs, save_dir=args.save,
                             start_epoch=start_epoch, best_acc=best_acc,
                             extra={"args": plain_args(args), **extra}, log=say)
        say(f"best test accuracy {result['best_acc']:.2f}%; checkpoints in {args.save}/ "
            "(best.pth, last.pth), metrics in metrics.jsonl")
    finally:
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
        if args.arch == "vgg" and args.cfg is None:
            options["depth"] = args.depth
        return models.build(args.arch, cfg=args.cfg, **options), {}

    run_training(args, make_model)


def check_classes(ckpt: dict, path, num_classes: int) -> None:
    have = (ckpt.get("options") or {}).get("num_classes")
    if have is not None and have != num_classes:
        raise ValueError(f"{path} has {have} output classes but the dataset has {num_classes}")


def load_for_data(path: Path, num_classes: int, device: torch.device):
    ckpt = load_checkpoint(path, map_location=device)
    model = model_from_checkpoint(ckpt, path)
    check_classes(ckpt, path, num_classes)
    return ckpt, model


def cmd_finetune(args) -> None:
    def make_model(num_classes: int, device: torch.device):
        ckpt, model = load_for_data(args.checkpoint, num_classes, device)
        source = {"path": str(args.checkpoint), "acc": ckpt.get("acc"),
                  "source_acc": ckpt.get("source_acc")}
        return model, {"cfg_mask": ckpt.get("cfg_mask"), "source": source}

    run_training(args, make_model)


def cmd_eval(args) -> None:
    device = device_for(args)
    from .engine import evaluate

    _, test_loader, num_classes = loaders(args, device)
    _, model = load_for_data(args.checkpoint, num_classes, device)
    announce_device(args, device)
    m = evaluate(model.to(device), test_loader, device)
    print(f"{args.checkpoint}: top-1 accuracy {m['acc']:.2f}%  loss {m['loss']:.4f}  "
          f"({m['count']} test images, {count_params(model):,} parameters)")


def cmd_prune(args) -> None:
    out = args.save / "pruned.pth"
    check_output(out, args.overwrite)
    ckpt = load_checkpoint(args.checkpoint)
    model = model_from_checkpoint(ckpt, args.checkpoint)
    result = prune(model, percent=args.percent, threshold=args.threshold,
                   min_channels=args.min_channels)
    table = result.layer_table()
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


def expand_config(parser: Parser, argv: list[str]) -> list[str]:
    """Splice the ``--config FILE.yaml`` keys in as flags right after the subcommand, so that
    flags given on the command line (which come later) override them."""
    for i, tok in enumerate(argv):
        if tok == "--config" and i + 1 < len(argv):
            path = argv[i + 1]
        elif tok.startswith("--config="):
            path = tok.split("=", 1)[1]
        else:
            continue
        break
    else:
        return argv
    import yaml

    command = argv[0]
    sub = parser._subparsers._group_actions[0].choices.get(command)
    try:
        with open(path) as f:
            config = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError) as e:
        parser.error(f"--config {path}: cannot read it ({str(e).splitlines()[0]})")
    if not isinstance(config, dict):
        parser.error(f"--config {path}: expected a mapping of flag names to values")
    tokens: list[str] = []
    for key, value in config.items():
        flag = "--" + str(key).replace("_", "-")
        if sub is None or flag not in sub._option_string_actions or flag == "--config":
            parser.error(f"--config {path}: unknown key {key!r} for slimming {command}")
        if value is True:
            tokens.append(flag)
        elif isinstance(value, list):
            tokens += [flag, ",".join(str(v) for v in value)]
        elif value is not None and value is not False:
            tokens += [flag, str(value)]
    return [command, *tokens, *argv[1:]]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(expand_config(parser, argv))
    try:
        args.func(args)
    except (ValueError, CheckpointError) as e:  # DataError and CheckpointError are ValueErrors
        print(f"slimming {args.command}: error: {e}", file=sys.stderr)
        return 2
    except TrainingError as e:
        print(f"slimming {args.command}: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # unwritable --save, full disk, ...
        print(f"slimming {args.command}: error: {e.filename or ''}: {e.strerror or e}",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"slimming {args.command}: interrupted", file=sys.stderr)
        return 130
    return 0
