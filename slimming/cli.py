"""Command line: ``slimming train | prune | finetune | eval``. A thin layer over the library
that turns user mistakes into one line on stderr and exit code 2."""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import torch

from .checkpoint import (
    CheckpointError,
    checkpoint_dict,
    load_checkpoint,
    model_from_checkpoint,
    save_checkpoint,
)
from .engine import NO_CUDA_NOTICE, TrainingError, resolve_device
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
    p.add_argument("--batch-size", type=positive_int, default=64)
    p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")


def add_training_flags(p: argparse.ArgumentParser, epochs: int) -> None:
    add_data_flags(p)
    p.add_argument("--epochs", type=positive_int, default=epochs)
    p.add_argument("--lr", type=positive_float, default=0.1)
    p.add_argument("--momentum", type=_number(float, 0.0, True, ">= 0"), default=0.9)
    p.add_argument("--nesterov", action="store_true")
    p.add_argument("--weight-decay", type=nonneg_float, default=1e-4)
    p.add_argument("--sparsity", type=nonneg_float, default=0.0, metavar="S",
                   help="L1 strength on BN gammas (0 = off; the paper uses 1e-4 for VGG)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--save", type=Path, required=True, metavar="DIR",
                   help="folder for last.pth, best.pth and metrics.jsonl")
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


def check_output(path: Path, overwrite: bool) -> None:
    """Refuse to clobber an existing output, or to write where a file blocks the folder."""
    for parent in [path.parent, *path.parent.parents]:
        if parent.exists() and not parent.is_dir():
            raise ValueError(f"{parent} is a file, not a folder: choose another --save")
    if path.exists() and not overwrite:
        raise ValueError(f"{path} already exists: pass --overwrite to replace it, or choose "
                         "another --save")


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


def run_fit(args, model, device, train_loader, test_loader, extra: dict) -> None:
    from .engine import fit, make_optimizer, make_scheduler
    from .sparsity import BNSparsity

    check_output(args.save / "last.pth", args.overwrite)
    args.save.mkdir(parents=True, exist_ok=True)
    (args.save / "metrics.jsonl").unlink(missing_ok=True)  # a fresh run starts a fresh log
    optimizer = make_optimizer(model, args.lr, args.momentum, args.weight_decay, args.nesterov)
    scheduler = make_scheduler(optimizer, args.epochs)
    sparsity = BNSparsity(model, args.sparsity) if args.sparsity > 0 else None
    result = fit(model, train_loader, test_loader, epochs=args.epochs, optimizer=optimizer,
                 scheduler=scheduler, device=device, save_dir=args.save, sparsity=sparsity,
                 extra={"args": plain_args(args), **extra})
    print(f"best test accuracy {result['best_acc']:.2f}%; checkpoints in {args.save}/ "
          "(best.pth, last.pth), metrics in metrics.jsonl")


def loaders(args, device):
    from .data import build_loaders

    return build_loaders(args.dataset, args.data_root, args.batch_size, max(args.workers, 0),
                         args.download, getattr(args, "seed", None), device.type == "cuda")


def cmd_train(args) -> None:
    import models

    device = device_for(args)
    check_output(args.save / "last.pth", args.overwrite)
    seed_everything(args.seed)
    train_loader, test_loader, num_classes = loaders(args, device)
    options = {"num_classes": num_classes}
    if args.arch == "vgg" and args.cfg is None:
        options["depth"] = args.depth
    model = models.build(args.arch, cfg=args.cfg, **options).to(device)
    announce_device(args, device)
    print(f"{args.arch} cfg {model.cfg}: {count_params(model):,} parameters, on {device}")
    run_fit(args, model, device, train_loader, test_loader, {})


def load_for_data(path: Path, num_classes: int, device: torch.device):
    ckpt = load_checkpoint(path, map_location=device)
    model = model_from_checkpoint(ckpt, path)
    have = ckpt.get("options", {}).get("num_classes")
    if have is not None and have != num_classes:
        raise ValueError(f"{path} has {have} output classes but the dataset has {num_classes}")
    return ckpt, model


def cmd_finetune(args) -> None:
    device = device_for(args)
    check_output(args.save / "last.pth", args.overwrite)
    seed_everything(args.seed)
    train_loader, test_loader, num_classes = loaders(args, device)
    ckpt, model = load_for_data(args.checkpoint, num_classes, device)
    announce_device(args, device)
    print(f"fine-tuning {ckpt['arch']} cfg {model.cfg}: {count_params(model):,} parameters")
    source = {"path": str(args.checkpoint), "acc": ckpt.get("acc"),
              "source_acc": ckpt.get("source_acc")}
    run_fit(args, model, device, train_loader, test_loader,
            {"cfg_mask": ckpt.get("cfg_mask"), "source": source})


def cmd_eval(args) -> None:
    device = device_for(args)
    from .engine import evaluate

    _, test_loader, num_classes = loaders(args, device)
    _, model = load_for_data(args.checkpoint, num_classes, device)
    announce_device(args, device)
    m = evaluate(model.to(device), test_loader, device)
    print(f"{args.checkpoint}: top-1 accuracy {m['acc']:.2f}%  loss {m['loss']:.4f}  "
          f"({len(test_loader.dataset)} test images, {count_params(model):,} parameters)")


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


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
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
