"""What runs once the arguments are read (``slimming.cli.main``): the checks across flags
(``check_args``), the command itself, and the one place a mistake becomes one line on stderr and
exit code 2, with the flag written where the library's message names a parameter (``in_flags``).
Imported only after ``parser`` has read the arguments, since it imports torch."""

from __future__ import annotations

import argparse
import re
import sys
import warnings

from .. import models
from ..errors import (
    NamesParameters,
    SlimmingError,
    TrainingError,
    clip,
    first_line,
    is_out_of_memory,
)
from ..pruning.amount import Amount
from ..training import runs
from ..utils import devices, progress
from ..utils.files import handle_signals, human_bytes
from . import commands, pipeline
from .parser import Parser

# --------------------------------------------------------------------------- checks across flags

def check_args(parser: Parser, args: argparse.Namespace) -> None:
    """What no single flag's type can see: contradictions and flags that must fit each other."""
    if hasattr(args, "cpu"):
        try:
            runs.device_for(args)
        except SlimmingError as e:
            parser.error(str(e))
    external = models.external.is_external(getattr(args, "arch", None))
    if args.command in ("train", "pipeline") and external:
        if args.cfg is not None or args.depth is not None:
            parser.error(f"--cfg and --depth are for the shipped families; {clip(args.arch)} takes its "
                         "options through --model-kwargs")
        try:
            models.build(args.arch, empty=True, num_classes=args.num_classes, kwargs=args.model_kwargs)
        except ValueError as e:
            parser.error(f"--arch {clip(args.arch)}: {first_line(e)}")
    elif args.command in ("train", "pipeline") and args.model_kwargs:
        parser.error("--model-kwargs is for torchvision:/timm:/your own architectures; the "
                     "shipped families take --depth and --cfg")
    elif getattr(args, "cfg", None) is not None or (args.command in ("train", "pipeline")
                                                     and args.depth is not None):
        options = {} if args.depth is None or args.cfg is not None else {"depth": args.depth}
        try:
            models.build(args.arch, cfg=args.cfg, empty=True, **options)
        except ValueError as e:
            flag = "--cfg" if args.cfg is not None else "--depth"
            parser.error(f"{flag} does not fit --arch {clip(args.arch)}: {first_line(e)}")
    if getattr(args, "amp_dtype", None) and not args.amp:
        parser.error("--amp-dtype only applies with --amp; add --amp")
    latency = getattr(args, "target_latency", None)
    if args.command == "pipeline" and args.iterations > 1 and latency is not None \
            and Amount.of(target_latency=latency).unit == "ms":
        parser.error("--iterations takes --target-latency as a fraction (each iteration cuts its share "
                     "of it), not a time")
    if getattr(args, "sparsity_target", None) is not None and not args.sparsity > 0:
        parser.error("--sparsity-target steers a strength: give the starting one, e.g. --sparsity 1e-4")


def out_of_memory(e: BaseException) -> str | None:
    """One line for an allocation that failed (a MemoryError, the CPU allocator's "can't
    allocate memory", CUDA's OutOfMemoryError): how much was asked for, when the allocator says,
    and what to lower. None for any other error."""
    if not is_out_of_memory(e):
        return None
    asked = re.search(r"allocate (\d+) bytes|Tried to allocate ([\d.]+ [KMGT]iB)", str(e))
    size = ""
    if asked:
        size = f" ({human_bytes(int(asked[1])) if asked[1] else asked[2]} asked for)"
    return (f"out of memory{size}: lower --batch-size or the image size (--image-size, "
            "--input-size), or use a smaller network")


# the library's parameters whose flag is not the parameter's name with dashes
FLAGS = {"root": "--data-root", "count": "--recalibrate-bn", "name": "--dataset"}


def flag_of(param: str) -> str:
    return FLAGS.get(param, "--" + param.replace("_", "-"))


def in_flags(e: NamesParameters) -> str:
    """``e``'s message with the flag written where it names a Python parameter (the first time
    each, not inside a path or a quoted name): the library says ``target_flops``, the command
    line ``--target-flops``."""
    text = str(e)
    for param in e.params:
        flag = flag_of(param)
        pattern = rf"(?<![\w'/.-]){re.escape(param)}(?![\w'/.-])"
        text = re.sub(pattern, lambda _, flag=flag: flag, text, count=1)
    return text


def run(args: argparse.Namespace) -> int:
    """Run the command ``args`` was read for (by ``parser.read_args``); the exit code."""
    check_args(Parser(prog=f"slimming {args.command}", add_help=False), args)  # errors name the command
    devices.new_command()
    name = f"slimming {args.command}"
    # "commands.cmd_train", looked up at the call (so that a test's patch of it counts)
    module, _, function = args.func.partition(".")
    func = getattr({"commands": commands, "pipeline": pipeline}[module], function)

    def warn(message, category, filename, lineno, file=None, line=None):  # one line each
        print(f"{name}: warning: {message}", file=sys.stderr)

    with handle_signals(), warnings.catch_warnings(), progress.quiet(getattr(args, "quiet", False)):
        warnings.showwarning = warn
        try:
            func(args)
        except SlimmingError as e:  # the user's mistake: one line, no traceback
            print(f"{name}: error: {in_flags(e)}", file=sys.stderr)
            return 2
        except TrainingError as e:
            print(f"{name}: error: {in_flags(e)}", file=sys.stderr)
            return 1
        except (MemoryError, RuntimeError) as e:  # RuntimeError: the allocators' failures
            reason = out_of_memory(e)
            if reason is None:
                raise  # a bug: keep its traceback
            print(f"{name}: error: {reason}", file=sys.stderr)
            return 2
        except OSError as e:  # a full disk, a folder removed under the run, ...
            print(f"{name}: error: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print(f"{name}: interrupted", file=sys.stderr)
            return 130
        except SystemExit as e:
            if isinstance(e.code, int) and e.code > 128:  # a signal, raised by handle_signals
                print(f"{name}: stopped by signal {e.code - 128}", file=sys.stderr)
            raise
    return 0
