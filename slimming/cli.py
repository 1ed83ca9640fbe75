"""Command line: ``slimming train | prune | finetune | eval | stats | sweep | export | report |
pipeline``. Parses arguments (and ``--config`` files) and turns user mistakes into one line on
stderr and exit code 2; ``commands.py`` does the work."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import commands
from .checkpoint import CheckpointError
from .engine import AMP_DTYPES, TrainingError


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
    p.add_argument("--deterministic", action="store_true",
                   help="deterministic algorithms only (needs --seed): repeatable runs")
    p.add_argument("--save", type=Path, required=True, metavar="DIR",
                   help="folder for last.pth, best.pth and metrics.jsonl")
    p.add_argument("--resume", default=None, metavar="PATH|auto",
                   help="continue a run: a checkpoint, or auto = DIR/last.pth if it exists")
    p.add_argument("--overwrite", action="store_true", help="replace a run already in --save")
    add_device_flags(p)


def add_arch_flags(p: argparse.ArgumentParser, default: str | None) -> None:
    p.add_argument("--arch", default=default, help="nin, vgg, preresnet or densenet"
                   + ("" if default else "; needed for checkpoints of the paper's own code"))
    p.add_argument("--depth", type=int, default=None,
                   help="VGG 11/13/16/19 (default 19), ResNet 9n+2, DenseNet 3n+4")


def add_prune_flags(p: argparse.ArgumentParser, required: bool) -> None:
    how = p.add_mutually_exclusive_group(required=required)
    how.add_argument("--percent", type=float, help="fraction of prunable channels to remove, in [0, 1)")
    how.add_argument("--threshold", type=float, help="remove channels with |gamma| <= T")
    p.add_argument("--min-channels", type=positive_int, default=1,
                   help="channels every layer keeps at least (default 1)")


def input_size(text: str) -> tuple[int, ...]:
    try:
        size = tuple(int(v) for v in text.split(","))
    except ValueError:
        size = ()
    if len(size) != 3 or min(size) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give C,H,W, e.g. 3,32,32")
    return size


def build_parser() -> Parser:
    parser = Parser(prog="slimming", description="Network slimming for PyTorch: sparsity "
                    "training, channel pruning and fine-tuning.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    p = sub.add_parser("train", help="train from scratch, with --sparsity S for slimming")
    add_arch_flags(p, "vgg")
    p.add_argument("--cfg", type=parse_cfg, default=None,
                   help="custom widths, e.g. 16,M,32,M,64,64,M,128,128,M,128,128")
    add_training_flags(p, epochs=160)
    p.set_defaults(func=commands.cmd_train)

    p = sub.add_parser("prune", help="cut low-|gamma| channels of a checkpoint")
    p.add_argument("--checkpoint", type=Path, required=True)
    add_arch_flags(p, None)
    add_prune_flags(p, required=True)
    p.add_argument("--save", type=Path, required=True, metavar="DIR", help="writes DIR/pruned.pth")
    p.add_argument("--overwrite", action="store_true", help="replace an existing pruned.pth")
    p.set_defaults(func=commands.cmd_prune)

    p = sub.add_parser("finetune", help="train a pruned checkpoint further (sparsity off)")
    p.add_argument("--checkpoint", type=Path, required=True)
    add_arch_flags(p, None)
    add_training_flags(p, epochs=160)
    p.set_defaults(func=commands.cmd_finetune)

    p = sub.add_parser("eval", help="top-1 accuracy and loss of a checkpoint on a test split")
    p.add_argument("--checkpoint", type=Path, required=True)
    add_arch_flags(p, None)
    add_data_flags(p)
    add_device_flags(p)
    p.set_defaults(func=commands.cmd_eval)

    p = sub.add_parser("stats", help="parameters, FLOPs, size and latency of a checkpoint")
    p.add_argument("--checkpoint", type=Path, required=True)
    p.add_argument("--compare", type=Path, help="a second checkpoint, shown side by side")
    add_arch_flags(p, None)
    p.add_argument("--input-size", type=input_size, default=(3, 32, 32), metavar="C,H,W")
    p.add_argument("--repeats", type=_number(int, 0, True, ">= 0"), default=10,
                   help="timed runs per latency figure (0: no latency)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_device_flags(p)
    p.set_defaults(func=commands.cmd_stats)

    p = sub.add_parser("sweep", help="prune at many percents, evaluate each without fine-tuning")
    p.add_argument("--checkpoint", type=Path, required=True)
    add_arch_flags(p, None)
    p.add_argument("--percents", default="0.1:0.9:0.1", help="start:stop:step or a comma list")
    p.add_argument("--min-channels", type=positive_int, default=1)
    p.add_argument("--save", type=Path, required=True, metavar="DIR",
                   help="writes sweep.csv, sweep.json, sweep.md and sweep.png")
    add_data_flags(p)
    add_device_flags(p)
    p.set_defaults(func=commands.cmd_sweep)

    p = sub.add_parser("export", help="TorchScript, ONNX or torch.export file, checked against PyTorch")
    p.add_argument("--checkpoint", type=Path, required=True)
    add_arch_flags(p, None)
    p.add_argument("--format", choices=("export", "torchscript", "onnx"), default="export",
                   help="export: a torch.export program (.pt2), the path PyTorch recommends")
    p.add_argument("--out", type=Path, required=True, metavar="FILE")
    p.add_argument("--input-size", type=input_size, default=(3, 32, 32), metavar="C,H,W")
    p.add_argument("--atol", type=positive_float, default=1e-4, help="largest difference accepted")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    p.set_defaults(func=commands.cmd_export)

    p = sub.add_parser("report", help="Markdown + JSON report (and PNG pictures) of a run folder")
    p.add_argument("--run", type=Path, required=True, metavar="DIR")
    p.add_argument("--repeats", type=_number(int, 0, True, ">= 0"), default=10,
                   help="timed runs per latency figure (0: no latency)")
    p.set_defaults(func=commands.cmd_report)

    p = sub.add_parser("pipeline", help="sparsity training -> prune -> fine-tune -> report, resumable")
    add_arch_flags(p, "vgg")
    p.add_argument("--cfg", type=parse_cfg, default=None)
    add_training_flags(p, epochs=160)
    add_prune_flags(p, required=True)
    p.add_argument("--finetune-epochs", type=positive_int, default=None, help="default: --epochs")
    p.add_argument("--finetune-lr", type=positive_float, default=None, help="default: --lr")
    p.add_argument("--baseline", action="store_true",
                   help="also train a no-sparsity baseline (baseline/) for the report")
    p.add_argument("--repeats", type=_number(int, 0, True, ">= 0"), default=10,
                   help="timed runs per latency figure in the report")
    p.set_defaults(func=commands.cmd_pipeline)
    return parser


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
