"""Command line: ``slimming train | prune | finetune | eval | stats | sweep | export | report |
pipeline``. Reads the arguments (and ``--config`` files, as defaults) and names a typo with the
flag it meant; ``run.py`` checks them against each other and runs the command. Flags are grouped
in ``--help`` (model, data, training, sparsity, output, device), each with its default.

Imports nothing that imports torch, so ``--help`` and a mistyped flag answer at once. The names
the flags offer are the shipped ones, written here (``tests/test_cli.py`` holds them equal to the
library's registries), and those a script registered before calling ``main`` (``registered``)."""

from __future__ import annotations

import argparse
import difflib
import math
import sys
from pathlib import Path

from ..errors import SlimmingError, as_fraction_hint, clip, first_line, parse_latency
from ..version import __version__

CONFIG_MAX_BYTES = 64 * 1024
CONFIG_MAX_DEPTH = 4
SHIPPED_ALIASES = {"resnet": "preresnet"}  # slimming.models.registry.ALIASES
# the shipped names of the library's registries, by the module that holds each
SHIPPED = {
    ("slimming.data.datasets", "DATASETS"): ("cifar10", "cifar100", "imagefolder", "synthetic"),
    ("slimming.pruning.importance", "CRITERIA"): ("bn-max", "bn-mean", "bn-sum"),
    ("slimming.models.registry", "FAMILIES"): ("densenet", "nin", "preresnet", "vgg"),
    ("slimming.models.registry", "ALIASES"): tuple(SHIPPED_ALIASES),
    ("slimming.measure.runtimes", "RUNTIMES"): ("eager", "export", "onnxruntime"),
}


def registered(module: str, name: str) -> list[str]:
    """The names registry ``name`` of ``module`` offers: the shipped ones, and those a script
    added (a family, a criterion, a data source) if it imported the registry before ``main``."""
    loaded = getattr(sys.modules.get(module), name, ())
    return sorted({*SHIPPED[module, name], *loaded})


def family_name(text: str) -> str:
    """A family's own name for ``text`` (``resnet`` -> ``preresnet``), as models.canonical."""
    aliases = getattr(sys.modules.get("slimming.models.registry"), "ALIASES", SHIPPED_ALIASES)
    return aliases.get(text, text)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows "(default: X)" for every flag that has a real default (not None or a switch's bool)."""

    def _get_help_string(self, action):
        if (action.default is None or isinstance(action.default, bool) or action.default is argparse.SUPPRESS
                or "%(default)" in (action.help or "")):
            return action.help
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        kwargs.setdefault("allow_abbrev", False)  # --epoch is a typo, not --epochs
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # one line, not usage + error
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _number(kind, low, low_ok: bool, what: str, high: float = math.inf):
    """An argparse type: a finite ``kind`` in [low, high) (low excluded unless ``low_ok``)."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            try:
                float(text)  # a number, but not a whole one: say what it must be
            except ValueError:
                raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
            raise argparse.ArgumentTypeError(f"{text} is not a whole number: it must be {what}") from None
        if (not math.isfinite(value) or value < low or (value == low and not low_ok)
                or value >= high):
            raise argparse.ArgumentTypeError(f"{text} is not {what}")
        return value
    return parse


positive_int = _number(int, 1, True, "a positive integer")
count = _number(int, 0, True, ">= 0")
positive_float = _number(float, 0.0, False, "positive")
nonneg_float = _number(float, 0.0, True, ">= 0")
_fraction = _number(float, 0.0, True, "in [0, 1)", high=1.0)


def fraction(text: str) -> float:
    """A fraction in [0, 1); a percentage given instead (70) is asked about ("did you mean 0.7?")."""
    try:
        return _fraction(text)
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"{e}{as_fraction_hint(text)}") from None

seed = _number(int, 0, True, "in [0, 2**63)", high=2**63)


def arch_name(text: str) -> str:
    """A shipped family (or the paper's alias), or torchvision:NAME / timm:NAME /
    package.module:function (checked when the flags are read together: ``check_args``)."""
    if ":" in text:
        return text
    name = family_name(text)
    families = registered("slimming.models.registry", "FAMILIES")
    if name not in families:
        names = sorted({*families, *registered("slimming.models.registry", "ALIASES")})
        raise argparse.ArgumentTypeError(f"unknown arch {text!r}{_arch_hint(text)}; choose one of: "
                                         f"{', '.join(names)}, or torchvision:NAME, timm:NAME, "
                                         "package.module:function")
    return name


# the depths each shipped family is built at, as --depth's help says (models/: vgg.DEFAULT_CFGS,
# preresnet.blocks_per_stage, densenet.layers_per_block), here without importing torch
DEPTHS = {"vgg": lambda d: d in (11, 13, 16, 19), "preresnet": lambda d: 11 <= d <= 1001 and (d - 2) % 9 == 0,
          "densenet": lambda d: 7 <= d <= 301 and (d - 4) % 3 == 0}


def _depth_of(family: str, depth: int) -> bool:
    """Whether ``depth`` is one the shipped ``family`` is built at (vgg19: VGG-19; resnet18 is no
    9n+2 pre-activation ResNet)."""
    return family in DEPTHS and DEPTHS[family](depth)


def _arch_hint(text: str) -> str:
    """"; did you mean torchvision:resnet18?" where torchvision or timm (if installed) has a
    network of that name, and "--arch vgg --depth 19" where the name is a family with its depth;
    "" where none has. Asked only on the way to an error: torchvision and timm are slow imports."""
    found = []
    family, digits = text.rstrip("0123456789"), text[len(text.rstrip("0123456789")):]
    if digits and _depth_of(family_name(family), int(digits)):
        found.append(f"--arch {family} --depth {digits}")
    try:
        import torchvision

        if text in torchvision.models.list_models():
            found.append(f"torchvision:{text}")
    except Exception:  # noqa: BLE001 (not installed, or broken: no hint)
        pass
    try:
        import timm

        if timm.is_model(text):
            found.append(f"timm:{text}")
    except Exception:  # noqa: BLE001 (an optional extra)
        pass
    return f"; did you mean {' or '.join(found)}?" if found else ""


def json_object(text: str) -> dict:
    import json

    try:
        value = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not JSON ({e})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("give a JSON object, e.g. '{\"width_mult\": 0.5}'")
    return value


def parse_cfg(text: str) -> list:
    """``16,M,32`` -> [16, 'M', 32]."""
    out: list = []
    for tok in text.split(","):
        tok = tok.strip()
        if tok.upper() == "M":
            out.append("M")
        elif tok.isdigit() and 0 < int(tok) <= 100_000:
            out.append(int(tok))
        else:
            raise argparse.ArgumentTypeError(f"bad cfg entry {tok[:20]!r}: use widths from 1 to "
                                             "100000 and M")
    return out


def latency(text: str) -> str:
    """A latency budget: a fraction in (0, 1) of the original's, or a time (12ms, 0.012s, or a
    number >= 1, in milliseconds), as ``parse_latency`` reads it; given to the library as written."""
    try:
        unit, value = parse_latency(text)
    except SlimmingError:
        raise argparse.ArgumentTypeError(f"{clip(text)!r}: give a fraction such as 0.5 or a time such as "
                                         "12ms") from None
    if unit == "ms" and _is_number(text) and text not in _NOTED:  # 5 alone: milliseconds, said once
        _NOTED.add(text)  # (read_args parses the line twice: first for --config, apply_config)
        print(f"note: --target-latency {text.strip()} is read as {value:g} ms (write {value:g}ms to say so; "
              "a fraction of the unpruned model's latency is under 1, such as 0.5)", file=sys.stderr)
    return text.strip()


_NOTED: set[str] = set()


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def round_to(text: str) -> int | str:
    """--round-to: a positive integer, or auto (the widths at the top of each measured step)."""
    if text == "auto":
        return text
    return positive_int(text)


def input_size(text: str) -> tuple[int, ...]:
    try:
        size = tuple(int(v) for v in text.split(","))
    except ValueError:
        size = ()
    if len(size) != 3 or min(size) < 1 or max(size) > 4096:
        raise argparse.ArgumentTypeError(f"{text!r}: give C,H,W, each from 1 to 4096, e.g. 3,32,32")
    return size


# --------------------------------------------------------------------------- flag groups

def add_device_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("device")
    g.add_argument("--cpu", action="store_true", help="run on the CPU even if CUDA is available")
    g.add_argument("--device", default=None, help="torch device, e.g. cuda:1 (default: cuda "
                   "if available, else cpu)")


def add_data_flags(p: argparse.ArgumentParser, dataset_default: str | None = "cifar10") -> None:
    g = p.add_argument_group("data")
    g.add_argument("--dataset", default=dataset_default,
                   choices=registered("slimming.data.datasets", "DATASETS"),
                   help="the dataset" if dataset_default else
                   "the dataset (default: what the checkpoint was trained on, else cifar10)")
    g.add_argument("--data-root", type=Path, default=None,
                   help="dataset folder (default: the checkpoint's when it says, else "
                   "~/.cache/slimming/data; for imagefolder a folder with train/<class>/* and "
                   "test/<class>/*, or an image pack made by benchmarks/pack_images.py)")
    g.add_argument("--download", action="store_true", help="download CIFAR if it is missing")
    g.add_argument("--limit", type=positive_int, default=None, metavar="N",
                   help="only the first N images of each class, in each split, of an image folder "
                   "(a quick try on part of a real folder; its files in sorted order)")
    g.add_argument("--batch-size", type=positive_int, default=64, help="images per step, per process")
    g.add_argument("--loader", choices=("fast", "torchvision"), default="fast",
                   help="fast: decoded images held in memory (on the GPU when training there), "
                   "augmented a whole batch at a time; torchvision: Dataset + DataLoader")
    g.add_argument("--workers", type=count, default=2, help="DataLoader workers (torchvision loader)")
    g.add_argument("--image-size", type=_number(int, 1, True, "in [1, 8000]", high=8001), default=None,
                   metavar="N", help="train and evaluate on NxN images (default: the checkpoint's; "
                   "else 32 for the shipped CIFAR networks and for 32x32 images, 224 for others)")
    g.add_argument("--norm", choices=("dataset", "imagenet"), default=None,
                   help="per-channel normalisation: the training images' mean and std (measured "
                   "once, cached) or ImageNet's (default: the checkpoint's; else dataset)")


def add_model_flags(p: argparse.ArgumentParser, default: str | None, build: bool = False) -> None:
    """``build``: the flags that make a new network (train, pipeline)."""
    g = p.add_argument_group("model")
    g.add_argument("--arch", type=arch_name, default=default,
                   help="nin, vgg, preresnet (or resnet), densenet, torchvision:NAME, timm:NAME or "
                   "package.module:function (your own code, run only when you name it)"
                   + ("" if default else "; needed for checkpoints of the paper's own code and "
                      "of your own functions"))
    g.add_argument("--depth", type=positive_int, default=None,
                   help="VGG 11/13/16/19 (default 19), ResNet 9n+2 (default 164), DenseNet 3n+4 "
                   "(default 40)")
    if build:
        g.add_argument("--cfg", type=parse_cfg, default=None,
                       help="custom widths, e.g. 16,M,32,M,64,64,M,128,128,M,128,128 (VGG: M = "
                       "2x2 max-pool, four of them for 32x32 inputs; NIN: eight widths)")
        g.add_argument("--num-classes", type=positive_int, default=None,
                       help="outputs of the classifier (default: the dataset's classes)")
        g.add_argument("--model-kwargs", type=json_object, default={}, metavar="JSON",
                       help="other arguments of a torchvision/timm/your builder, e.g. "
                       "'{\"width_mult\": 0.5}'")
        g.add_argument("--init", type=Path, default=None, metavar="PATH",
                       help="start from these weights: a state_dict (or a file holding one under "
                       "'state_dict' or 'model'), e.g. your fine-tuned model")


def add_training_flags(p: argparse.ArgumentParser, epochs: int, dataset: str | None = "cifar10",
                       gates: bool = False, lr_help: str = "base learning rate") -> None:
    add_data_flags(p, dataset)
    g = p.add_argument_group("training")
    g.add_argument("--config", type=Path, metavar="FILE.yaml",
                   help="YAML file whose keys are long flag names; command-line flags override it")
    g.add_argument("--epochs", type=positive_int, default=epochs, help="epochs to train")
    g.add_argument("--opt", choices=("sgd", "adamw"), default="sgd", help="optimizer")
    g.add_argument("--lr", type=positive_float, default=0.1, help=lr_help)
    g.add_argument("--momentum", type=nonneg_float, default=0.9, help="SGD momentum")
    g.add_argument("--nesterov", action="store_true", help="Nesterov momentum")
    g.add_argument("--weight-decay", type=nonneg_float, default=1e-4, help="L2 weight decay")
    g.add_argument("--no-wd-bn", action="store_true", help="no weight decay on BN weights/biases")
    g.add_argument("--sched", choices=("step", "cosine"), default="step",
                   help="step: x0.1 at 50%% and 75%% of the epochs (the paper's); cosine")
    g.add_argument("--warmup-epochs", type=count, default=0, help="linear warm-up epochs")
    g.add_argument("--label-smoothing", type=fraction, default=0.0, help="in [0, 1)")
    g.add_argument("--grad-clip", type=nonneg_float, default=0.0, metavar="NORM",
                   help="clip the gradient norm (0 = off)")
    g.add_argument("--amp", action="store_true", help="mixed precision with torch.autocast")
    g.add_argument("--amp-dtype", choices=("float16", "bfloat16"), default=None,
                   help="default: float16 on CUDA (with GradScaler), bfloat16 on the CPU")
    g.add_argument("--channels-last", action="store_true", help="channels-last memory format")
    g.add_argument("--compile", action="store_true", help="torch.compile the model")
    g.add_argument("--sync-bn", action="store_true", help="SyncBatchNorm across GPUs (CUDA only)")
    g.add_argument("--seed", type=seed, default=None, help="seed for a repeatable run")
    g.add_argument("--deterministic", action="store_true",
                   help="deterministic algorithms only (needs --seed): repeatable runs")
    g.add_argument("--resume", default=None, metavar="PATH|auto",
                   help="continue a run: a checkpoint, or auto = DIR/last.pth if it exists")
    g = p.add_argument_group("sparsity")
    g.add_argument("--sparsity", type=nonneg_float, default=0.0, metavar="S",
                   help="L1 strength on the scaling factors: BatchNorm, GroupNorm, LayerNorm gammas, "
                   "gates (0 = off; the paper uses 1e-4 for VGG)")
    g.add_argument("--sparsity-target", type=_number(float, 0.0, False, "in (0, 1)", high=1.0),
                   default=None, metavar="F",
                   help="steer the strength (from --sparsity) epoch by epoch so that a fraction F "
                   "of prunable |gamma| ends under 1e-2")
    if gates:  # a new network only (finetune's comes from its checkpoint, gates and all)
        add_gates_flag(g)
    g = p.add_argument_group("output")
    g.add_argument("--save", type=Path, required=True, metavar="DIR",
                   help="folder for last.pth, best.pth and metrics.jsonl")
    g.add_argument("--overwrite", action="store_true", help="replace a run already in --save")
    add_device_flags(p)


def add_shape_flags(g, recalibrate: int = 0) -> None:
    """What every cut respects, however its size is chosen; ``recalibrate``: the default of
    --recalibrate-bn (50 where the data is at hand anyway: sweep, pipeline)."""
    g.add_argument("--importance", default="bn-max",
                   choices=registered("slimming.pruning.importance", "CRITERIA"),
                   help="how much a channel matters: bn-max is |gamma| (over a coupled group, the largest); "
                   "bn-mean and bn-sum average or add a group's |gamma|")
    g.add_argument("--min-channels", type=positive_int, default=1,
                   help="channels every layer keeps at least")
    g.add_argument("--round-to", type=round_to, default=None, metavar="K",
                   help="every pruned width a multiple of K (never above the original; the "
                   "extra channels are the best-scoring ones); auto: the widest width of each step "
                   "of the layer's latency, timed on this device (default: 1, and 8 with "
                   "--target-latency)")
    g.add_argument("--max-layer-prune", type=_number(float, 0.0, False, "in (0, 1]", high=1.0 + 1e-12),
                   default=1.0, metavar="F", help="no layer loses more than this fraction of its channels")
    g.add_argument("--no-compensate", dest="compensate", action="store_false",
                   help="the paper's cut: drop the constant a cut channel still emits instead of "
                   "folding it into the next layer")
    g.add_argument("--no-verify", dest="verify", action="store_false",
                   help="skip the check that the pruned network equals the original with the cut "
                   "channels zeroed (two forwards on a random input); the pruned network is still "
                   "run once")
    g.add_argument("--no-cut-heads", dest="cut_heads", action="store_false",
                   help="keep attention heads and splits by sizes a module holds whole (cut by "
                   "default where the check passes)")
    g.add_argument("--keep-branches", dest="remove_branches", action="store_false",
                   help="keep a residual branch whose width is cut whole at --min-channels, as the "
                   "paper does, instead of removing its layers")
    g.add_argument("--recalibrate-bn", type=count, default=recalibrate, metavar="N",
                   help="after the cut, re-estimate every BatchNorm's statistics on N training "
                   "batches (needs the data; 0 = off)")
    g.add_argument("--latency-batch", type=positive_int, default=1, metavar="N",
                   help="the batch --target-latency and --round-to auto time the network at")
    g.add_argument("--latency-runtime", default="eager",
                   choices=registered("slimming.measure.runtimes", "RUNTIMES"),
                   help="what --target-latency and --round-to auto time the network in: PyTorch (eager), "
                   "torch.export's program (export), or onnxruntime on the CPU (the onnx extra)")
    g.add_argument("--latency-seconds", type=positive_float, default=60.0, metavar="S",
                   help="how long one latency measurement may go on taking samples until its spread "
                   "can tell the budget apart (a busy machine needs more)")


def add_prune_flags(p: argparse.ArgumentParser, required: bool, recalibrate: int = 0) -> None:
    g = p.add_argument_group("sparsity")
    how = g.add_mutually_exclusive_group(required=required)
    how.add_argument("--percent", type=fraction,
                     help="fraction of prunable channels to remove, in [0, 1)")
    how.add_argument("--threshold", type=nonneg_float, help="remove channels with |gamma| <= T")
    how.add_argument("--target-flops", type=positive_float, metavar="R",
                     help="prune to a FLOPs budget: a fraction in (0, 1) of the unpruned model's, "
                     "or a count such as 2.5e8")
    how.add_argument("--target-params", type=positive_float, metavar="R",
                     help="prune to a parameter budget: a fraction in (0, 1) or a count")
    how.add_argument("--target-latency", type=latency, metavar="L",
                     help="prune to a latency measured on this device: a fraction in (0, 1) of the "
                     "unpruned model's, or a time such as 12ms (at --latency-batch, the model's input "
                     "size, the threads torch uses)")
    add_shape_flags(g, recalibrate)


def add_checkpoint_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", type=Path, required=True, help="a slimming checkpoint (or the "
                   "paper's, with --arch)")


def add_repeats_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repeats", type=_number(int, 0, True, "in [0, 10000]", high=10_001),
                   default=10, help="timed runs per latency figure (0: no latency)")


def build_parser() -> Parser:
    parser = Parser(prog="slimming", description="Network slimming for PyTorch: sparsity "
                    "training, channel pruning and fine-tuning.")
    parser.add_argument("--version", action="version", version=f"slimming {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    parser.commands = sub.choices  # name -> that subcommand's parser
    for add in (add_train_command, add_prune_command, add_finetune_command, add_eval_command,
                add_stats_command, add_sweep_command, add_export_command, add_report_command,
                add_pipeline_command, add_cache_command):  # one function per subcommand, in --help's order
        add(sub)
    for p in sub.choices.values():
        p.add_argument("-q", "--quiet", action="store_true",
                       help="no progress bars (they show on a terminal only) and no progress lines in a log; "
                       "results, warnings and errors are still printed (TQDM_DISABLE=1 does the same)")
    return parser


def add_gates_flag(g) -> None:
    g.add_argument("--gates", action="store_true",
                   help="put a gate (a per-channel scaling factor, trained with --sparsity) before each "
                   "layer that reads a width nothing else scores (an MLP's hidden width: ConvNeXt, "
                   "vision transformers), and one per head before each attention's output "
                   "projection (heads are then cut whole); prune folds them away")
    g.add_argument("--gates-everywhere", action="store_true",
                   help="--gates, and a gate before every layer that reads a width nothing scores, also "
                   "where several layers read it: for a network without normalisation (AlexNet, "
                   "SqueezeNet, a VGG without BatchNorm)")


def add_train_command(sub) -> None:
    p = sub.add_parser("train", help="train from scratch, with --sparsity S for slimming")
    add_model_flags(p, "vgg", build=True)
    add_training_flags(p, epochs=160, gates=True)
    p.set_defaults(func="commands.cmd_train")


def add_prune_command(sub) -> None:
    p = sub.add_parser("prune", help="cut low-|gamma| channels of a checkpoint")
    add_checkpoint_flag(p)
    add_model_flags(p, None)
    add_prune_flags(p, required=True)
    add_data_flags(p, None)  # read for --recalibrate-bn and the accuracy right after the cut
    g = p.add_argument_group("output")
    g.add_argument("--no-eval", dest="eval", action="store_false",
                   help="do not print the test accuracy right after the cut (printed when the data is "
                   "at hand: the data flags, or the checkpoint's dataset where it already is)")
    g.add_argument("--save", type=Path, required=True, metavar="DIR", help="writes DIR/pruned.pth")
    g.add_argument("--overwrite", action="store_true", help="replace an existing pruned.pth")
    add_device_flags(p)
    p.set_defaults(func="commands.cmd_prune")


FINETUNE_LR = "--lr / 100 under 3 epochs, --lr / 10 under 80, --lr from 80 (the paper's)"


def add_finetune_command(sub) -> None:
    p = sub.add_parser("finetune", help="train a pruned checkpoint further (sparsity off)")
    add_checkpoint_flag(p)
    add_model_flags(p, None)
    add_training_flags(p, epochs=160, dataset=None,
                       lr_help="base learning rate; default: by the fine-tune's length, "
                       f"{FINETUNE_LR.replace('--lr', '0.1')}")
    p.set_defaults(func="commands.cmd_finetune", lr=None)


def add_eval_command(sub) -> None:
    p = sub.add_parser("eval", help="top-1 accuracy and loss of a checkpoint on a test split")
    add_checkpoint_flag(p)
    add_model_flags(p, None)
    add_data_flags(p, None)
    add_device_flags(p)
    p.set_defaults(func="commands.cmd_eval")


def add_stats_command(sub) -> None:
    p = sub.add_parser("stats", help="parameters, FLOPs, size and latency of a checkpoint")
    add_checkpoint_flag(p)
    p.add_argument("--compare", type=Path, help="a second checkpoint, shown side by side")
    add_model_flags(p, None)
    p.add_argument("--input-size", type=input_size, default=None, metavar="C,H,W",
                   help="the input of one image (default: the size the model was trained at, "
                   "else 3,32,32)")
    add_repeats_flag(p)
    p.add_argument("--layers", action="store_true", help="also each convolution's and linear layer's "
                   "latency, timed alone at its widths (batch 1; with --compare, side by side)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_device_flags(p)
    p.set_defaults(func="commands.cmd_stats")


def add_sweep_command(sub) -> None:
    p = sub.add_parser("sweep", help="prune at many percents, evaluate each without fine-tuning")
    add_checkpoint_flag(p)
    add_model_flags(p, None)
    g = p.add_argument_group("sparsity")
    axis = g.add_mutually_exclusive_group()
    axis.add_argument("--percents", default=None,
                      help="start:stop:step or a comma list of fractions of channels to remove "
                      "(default 0.1:0.9:0.1)")
    axis.add_argument("--target-flops", default=None, metavar="LIST",
                      help="sweep FLOPs budgets instead: fractions of the unpruned model's, e.g. "
                      "0.3:0.9:0.1")
    axis.add_argument("--target-params", default=None, metavar="LIST",
                      help="sweep parameter budgets: fractions, e.g. 0.2,0.5")
    axis.add_argument("--target-latency", default=None, metavar="LIST",
                      help="sweep latency budgets, measured on this device: fractions of the unpruned "
                      "model's, e.g. 0.3,0.5,0.7")
    add_shape_flags(g, recalibrate=50)
    g = p.add_argument_group("output")
    g.add_argument("--save", type=Path, required=True, metavar="DIR",
                   help="writes sweep.csv, sweep.json, sweep.md and sweep.png")
    add_data_flags(p, None)
    add_device_flags(p)
    p.set_defaults(func="commands.cmd_sweep")


def add_export_command(sub) -> None:
    p = sub.add_parser("export", help="TorchScript, ONNX or torch.export file, checked against PyTorch")
    add_checkpoint_flag(p)
    add_model_flags(p, None)
    g = p.add_argument_group("output")
    g.add_argument("--format", choices=("export", "torchscript", "onnx"), default="export",
                   help="export: a torch.export program (.pt2), the path PyTorch recommends")
    g.add_argument("--out", type=Path, required=True, metavar="FILE", help="the file to write")
    g.add_argument("--input-size", type=input_size, default=None, metavar="C,H,W",
                   help="the input of one image (default: the size the model was trained at, "
                   "else 3,32,32)")
    g.add_argument("--atol", type=positive_float, default=1e-4, help="largest difference accepted")
    g.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    add_device_flags(p)
    p.set_defaults(func="commands.cmd_export")


def add_cache_command(sub) -> None:
    p = sub.add_parser("cache", help="where the latency tables (--target-latency, --round-to auto) are "
                       "kept, their size; --clear empties them")
    p.add_argument("--clear", action="store_true", help="remove every latency table (they are timed "
                   "again when next needed)")
    p.set_defaults(func="commands.cmd_cache")


def add_report_command(sub) -> None:
    p = sub.add_parser("report", help="Markdown + JSON report (and PNG pictures) of a run folder")
    p.add_argument("--run", type=Path, required=True, metavar="DIR", help="a pipeline's --save folder")
    p.add_argument("--arch", type=arch_name, default=None,
                   help="package.module:function, when the run's network is your own code")
    add_repeats_flag(p)
    add_device_flags(p)
    p.set_defaults(func="commands.cmd_report")


def add_pipeline_command(sub) -> None:
    p = sub.add_parser("pipeline", help="sparsity training -> prune -> fine-tune -> report, resumable")
    add_model_flags(p, "vgg", build=True)
    add_training_flags(p, epochs=160, gates=True)
    add_prune_flags(p, required=True, recalibrate=50)
    g = p.add_argument_group("training")
    g.add_argument("--finetune-epochs", type=positive_int, default=None, help="default: --epochs")
    g.add_argument("--finetune-lr", type=positive_float, default=None,
                   help=f"default: by the fine-tune's length, {FINETUNE_LR}")
    g.add_argument("--baseline", action="store_true",
                   help="also train a no-sparsity baseline (baseline/) for the report")
    g.add_argument("--iterations", type=positive_int, default=1, metavar="N",
                   help="prune a share of the budget, fine-tune (--finetune-epochs each time), "
                   "repeat: N times (the paper's multi-pass scheme)")
    add_repeats_flag(p)
    p.set_defaults(func="pipeline.run_pipeline")


# --------------------------------------------------------------------------- config files

def _config_loader():
    import yaml

    class Loader(yaml.SafeLoader):
        """SafeLoader without aliases (a config needs none, and ``*a`` repeated is the
        "billion laughs" expansion) and with a nesting limit (a config is flat)."""

        depth = 0

        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                raise yaml.YAMLError("aliases (*name) are not accepted in a config file")
            self.depth += 1
            try:
                if self.depth > CONFIG_MAX_DEPTH:
                    raise yaml.YAMLError(f"nested deeper than {CONFIG_MAX_DEPTH} levels")
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

    return yaml, Loader


def read_config(path: str) -> dict:
    """A ``--config`` file as {key: scalar or flat list of scalars}; SlimmingError otherwise."""
    yaml, Loader = _config_loader()
    try:
        with open(path, "rb") as f:
            data = f.read(CONFIG_MAX_BYTES + 1)
    except OSError as e:
        raise SlimmingError(f"--config {path}: cannot read it ({e.strerror})") from None
    if len(data) > CONFIG_MAX_BYTES:
        raise SlimmingError(f"--config {path}: larger than {CONFIG_MAX_BYTES // 1024} KiB; a config "
                            "holds a few flags")
    try:
        config = yaml.load(data.decode("utf-8"), Loader=Loader) or {}
    except UnicodeDecodeError:
        raise SlimmingError(f"--config {path}: not UTF-8 text") from None
    except yaml.YAMLError as e:
        raise SlimmingError(f"--config {path}: cannot read it ({first_line(e)})") from None
    if not isinstance(config, dict):
        raise SlimmingError(f"--config {path}: expected a mapping of flag names to values")
    scalar = (str, int, float, bool)
    for key, value in config.items():
        if not isinstance(key, str) or not (isinstance(value, scalar) or value is None or (
                isinstance(value, list) and all(isinstance(v, scalar) for v in value))):
            raise SlimmingError(f"--config {path}: key {str(key)[:40]!r} must map to a value or a "
                                "flat list of values")
    return config


def check_spelling(parser: Parser, argv: list[str]) -> None:
    """A command or flag the parser does not know is an error naming it, with the nearest one
    it knows, before argparse would speak of something else (a required flag the typo left out:
    ``--precent 0.5`` is "--percent or --threshold required" to argparse)."""
    if not argv or argv[0].startswith("-"):
        return
    if argv[0] not in parser.commands:
        near = difflib.get_close_matches(argv[0], list(parser.commands), 1, 0.6)
        if near:
            parser.error(f"unknown command {clip(argv[0])}; did you mean {near[0]}?")
        return
    sub = parser.commands[argv[0]]
    known = [flag for flag in sub._option_string_actions if flag.startswith("--")]
    for token in argv[1:]:
        if token == "--":
            break
        flag = token.split("=", 1)[0]
        if token.startswith("--") and flag not in known:
            near = difflib.get_close_matches(flag, known, 1, 0.6)
            sub.error(f"unrecognized argument {clip(flag)}" + (f"; did you mean {near[0]}?" if near else ""))


def apply_config(parser: Parser, argv: list[str]) -> None:
    """``--config FILE.yaml``: its keys become the subcommand's defaults (``set_defaults``, as
    timm does), so flags given on the command line override them. A key is a flag's name
    (``lr``, ``label_smoothing``; a switch takes true or false); every value other than a switch's
    is handed over as the text a command line would give, so argparse converts and checks it
    with the flag's own type."""
    first, _ = parser.parse_known_args(argv)
    path = getattr(first, "config", None)
    if path is None:
        return
    try:
        config = read_config(str(path))
    except SlimmingError as e:
        parser.error(str(e))
    sub, known = parser.commands[first.command], vars(first)
    defaults = {}
    for key, value in config.items():
        dest = key.replace("-", "_")
        if dest.startswith("no_") and isinstance(sub.get_default(dest[3:]), bool) and isinstance(value, bool):
            dest, value = dest[3:], not value  # --no-compensate: true
        if dest not in known or dest in ("config", "command", "func"):
            parser.error(f"--config {path}: unknown key {key[:40]!r} for slimming {first.command}")
        if isinstance(sub.get_default(dest), bool):
            if not isinstance(value, bool):
                parser.error(f"--config {path}: {key[:40]} is a switch: give true or false")
            defaults[dest] = value
        elif isinstance(value, bool):
            parser.error(f"--config {path}: {key[:40]} takes a value, not {str(value).lower()}")
        elif value is not None:
            defaults[dest] = ",".join(map(str, value)) if isinstance(value, list) else str(value)
    for action in sub._actions:  # argparse checks choices on the command line only
        value = defaults.get(action.dest)
        if action.choices is not None and value is not None and not isinstance(value, bool):
            try:
                converted = action.type(value) if callable(action.type) else value
            except (argparse.ArgumentTypeError, ValueError, TypeError):
                continue  # argparse says what is wrong with it when it converts the default
            if converted not in action.choices:
                parser.error(f"--config {path}: {action.dest} {clip(str(value), 40)!r} is not one of: "
                             f"{', '.join(map(str, action.choices))}")
    sub.set_defaults(**defaults)


def read_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments of one command line (``sys.argv[1:]`` by default), its ``--config`` applied
    as defaults; a typo, a bad value or ``--help`` exits here, before torch is imported."""
    parser = build_parser()
    _NOTED.clear()  # each command line's notes once
    argv = list(sys.argv[1:] if argv is None else argv)
    check_spelling(parser, argv)
    apply_config(parser, argv)
    return parser.parse_args(argv)
