"""``slimming pipeline``: sparsity training -> prune -> fine-tune -> report, each stage in its own
sub-folder of --save; rerun the same command to pick up where it stopped (finished stages are
skipped, an interrupted one resumes). ``--iterations N`` prunes a share of the budget, fine-tunes
and repeats, N times (the paper's multi-pass scheme): iterations before the last write iterK/.

Under torchrun every rank trains (DistributedDataParallel, one process group for all stages),
but only rank 0 prunes, evaluates the pruned network, writes the report and prints; the other
ranks wait until rank 0 is done and then read what it wrote. If rank 0 fails, they stop too.

The training stages are ``train(config)`` calls, each a ``dataclasses.replace`` of the
pipeline's own ``TrainConfig``; the prune, evaluation and report stages run those commands.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import itertools
from collections.abc import Callable
from pathlib import Path

from ..errors import SlimmingError
from ..io.checkpoint import load_checkpoint, load_model, model_from_checkpoint
from ..measure.stats import count_flops, count_params, input_size_of
from ..models.external import is_user_code
from ..pruning.amount import Amount
from ..pruning.budget import parse_budget
from ..tools.report import BASELINE, FINETUNED, PRUNED, SPARSE
from ..training.config import TrainConfig, finetune_lr
from ..training.distributed import DistInfo, broadcast_flag, distributed_session
from ..training.runs import check_output, default_data, device_for, native_size, plain, plain_args
from ..training.train import train
from ..utils.files import RunLock
from .commands import checkpoint_model, cmd_eval, cmd_prune, cmd_report, new_model, say_below_cut, write_eval


def on_main(dist: DistInfo, work: Callable[[], None]) -> None:
    """Run ``work`` on rank 0 only; every rank leaves together, knowing whether it succeeded."""
    ok = False
    try:
        if dist.is_main:
            work()
        ok = True
    finally:
        if dist.enabled:
            if not broadcast_flag(ok) and not dist.is_main:  # also the barrier
                raise SlimmingError("rank 0 failed (its message says why); stopping")


def budget_share(args: argparse.Namespace, i: int, source, arch) -> dict:
    """The prune flags of iteration ``i`` of ``--iterations N``, each cut from the previous
    iteration's fine-tuned network: a percent p becomes 1 - (1 - p)^(1/N) each time (N cuts
    leave the same channels as p would at once); a FLOPs or parameter budget becomes the
    geometric step towards it, R^(i/N) of the sparse model's count; a latency fraction L is
    L^(1/N) of each iteration's own; a threshold stays as it is. One iteration: the flags as given."""
    n = args.iterations
    if n == 1:
        return {}
    if args.percent is not None:
        return {"percent": 1 - (1 - args.percent) ** (1 / n)}
    if getattr(args, "target_latency", None) is not None:  # each cut's fraction of the network it cuts
        latency = Amount.of(target_latency=args.target_latency)
        if latency.unit != "fraction":
            raise SlimmingError("--iterations takes --target-latency as a fraction (each iteration cuts "
                                "its share of it), not a time", param="target_latency")
        return {"target_latency": latency.value ** (1 / n)}
    what = "flops" if args.target_flops is not None else "params" if args.target_params is not None else None
    if what is None:
        return {}
    sparse = load_model(source, arch=arch)  # the sparse model: budgets are fractions of it
    full = count_flops(sparse, input_size_of(sparse)) if what == "flops" else count_params(sparse)
    target = parse_budget(getattr(args, f"target_{what}"), full, what)
    return {f"target_{what}": float(full * (target / full) ** (i / n))}


def prune_and_evaluate(ns: argparse.Namespace, heading: str = "== prune ==") -> None:
    """Rank 0's stage: prune ``ns.checkpoint`` into ``ns.save``/pruned.pth (unless done) and
    evaluate it right after the cut into eval.json (unless done)."""
    pruned, evaluated = ns.save / "pruned.pth", ns.save / "eval.json"
    print(heading)
    if pruned.exists():
        print(f"{pruned} exists: skipping")
    else:
        cmd_prune(ns)
    if not evaluated.exists():
        m = cmd_eval(argparse.Namespace(**{**vars(ns), "checkpoint": pruned}))
        write_eval(ns.save, m)


def run_pipeline(args: argparse.Namespace) -> None:
    root = args.save
    check_output(root / "x", False)  # only refuses a --save that is a file or unwritable
    device = device_for(args)

    # the later stages read checkpoints, which name their arch; your own code's arch is run
    # only when named, so it is named again for them
    arch = args.arch if is_user_code(args.arch) else None

    config = TrainConfig.from_args(args)  # the sparsity run's; each training stage varies it

    def stage_config(name: str, **changes) -> tuple[TrainConfig, dict]:
        """A training stage: its config (its own folder, resumed when it is there) and what its
        checkpoints record as the run's arguments."""
        changes = {"save": root / name, "resume": "auto", "overwrite": False, **changes}
        fields = {k: v for k, v in changes.items() if k in TrainConfig.__dataclass_fields__}
        return dataclasses.replace(config, **fields), {**plain_args(args), **plain(changes)}

    def prune_args(name: str, **changes) -> argparse.Namespace:
        """The prune stage's arguments: the pipeline's, for its own folder."""
        return argparse.Namespace(**{**vars(args), "save": root / name, "overwrite": False, **changes})

    def finetune(name: str, pruned: Path) -> None:
        stage, record = stage_config(name, checkpoint=pruned, arch=arch, depth=None, sparsity=0.0,
                                     sparsity_target=None, epochs=args.finetune_epochs or args.epochs,
                                     lr=args.finetune_lr or finetune_lr(args.finetune_epochs or args.epochs,
                                                                        args.lr))
        ckpt = load_checkpoint(pruned, **({"arch": arch} if arch else {}))  # on the CPU
        default_data(stage, ckpt, pruned)
        model = model_from_checkpoint(ckpt, pruned)
        run = train(stage, checkpoint_model(ckpt, pruned, model), native=native_size(ckpt["arch"]),
                    record=record)
        say_below_cut(pruned, run, stage.lr, stage.epochs, "--finetune-lr")

    with distributed_session(device.type == "cuda") as dist, contextlib.ExitStack() as held:
        say = print if dist.is_main else (lambda *a, **k: None)
        count = itertools.count(1)
        stages = int(args.baseline) + 2 * args.iterations + 2

        def heading(what: str) -> str:  # "== [3/5] fine-tune ==": where the run is, in its stages
            return f"== [{next(count)}/{stages}] {what} =="

        def lock_root() -> None:  # one pipeline per folder; its stages lock their own folders
            if dist.is_main and root.is_dir() and not held_lock:
                held.enter_context(RunLock(root))
                held_lock.append(True)

        held_lock: list[bool] = []
        lock_root()
        if args.baseline:
            say(heading("baseline (no sparsity)"))
            stage, record = stage_config(BASELINE, sparsity=0.0)
            train(stage, new_model(args), native=native_size(args.arch), record=record)
            lock_root()
        say(heading("sparsity training"))
        stage, record = stage_config(SPARSE)
        train(stage, new_model(args), native=native_size(args.arch), record=record)
        lock_root()
        source = root / SPARSE / "best.pth"
        for i in range(1, args.iterations + 1):  # the last iteration's folders are pruned/, finetuned/
            where = "" if i == args.iterations else f"iter{i}/"
            pruned = root / f"{where}{PRUNED}" / "pruned.pth"
            share = budget_share(args, i, root / SPARSE / "best.pth", arch)
            of = f" (iteration {i} of {args.iterations})" if args.iterations > 1 else ""
            ns = prune_args(f"{where}{PRUNED}", checkpoint=source, arch=arch, depth=None, **share)
            on_main(dist, functools.partial(prune_and_evaluate, ns, heading("prune" + of)))
            say(heading("fine-tune" + of))
            finetune(f"{where}{FINETUNED}", pruned)
            source = root / f"{where}{FINETUNED}" / "best.pth"

        def report() -> None:
            print(last)
            cmd_report(argparse.Namespace(run=root, repeats=args.repeats, cpu=args.cpu,
                                          device=args.device, arch=arch))

        last = heading("report")
        on_main(dist, report)
