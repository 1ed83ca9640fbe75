"""``slimming pipeline``: sparsity training -> prune -> fine-tune -> report, each stage in its own
sub-folder of --save; rerun the same command to pick up where it stopped (finished stages are
skipped, an interrupted one resumes). ``--iterations N`` prunes a share of the budget, fine-tunes
and repeats, N times (the paper's multi-pass scheme): iterations before the last write iterK/.

Under torchrun every rank trains (DistributedDataParallel, one process group for all stages),
but only rank 0 prunes, evaluates the pruned network, writes the report and prints; the other
ranks wait until rank 0 is done and then read what it wrote. If rank 0 fails, they stop too.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import json
from collections.abc import Callable

import torch.distributed as torch_dist

from ..errors import SlimmingError
from ..io.checkpoint import load_model
from ..measure.stats import count_flops, count_params, input_size_of
from ..models.external import is_user_code
from ..pruning.budget import parse_budget
from ..tools.report import BASELINE, FINETUNED, PRUNED, SPARSE
from ..training.distributed import DistInfo, distributed_session
from ..training.runs import check_output, device_for
from ..utils.files import RunLock, write_text
from .commands import cmd_eval, cmd_finetune, cmd_prune, cmd_report, cmd_train


def on_main(dist: DistInfo, work: Callable[[], None]) -> None:
    """Run ``work`` on rank 0 only; every rank leaves together, knowing whether it succeeded."""
    ok = False
    try:
        if dist.is_main:
            work()
        ok = True
    finally:
        if dist.enabled:
            flag = [ok]
            torch_dist.broadcast_object_list(flag, src=0)  # also the barrier
            if not flag[0] and not dist.is_main:
                raise SlimmingError("rank 0 failed (its message says why); stopping")


def budget_share(args: argparse.Namespace, i: int, source, arch) -> dict:
    """The prune flags of iteration ``i`` of ``--iterations N``, each cut from the previous
    iteration's fine-tuned network: a percent p becomes 1 - (1 - p)^(1/N) each time (N cuts
    leave the same channels as p would at once); a FLOPs or parameter budget becomes the
    geometric step towards it, R^(i/N) of the sparse model's count; a threshold stays as it
    is. One iteration: the flags as given."""
    n = args.iterations
    if n == 1:
        return {}
    if args.percent is not None:
        return {"percent": 1 - (1 - args.percent) ** (1 / n)}
    what = "flops" if args.target_flops is not None else "params" if args.target_params is not None else None
    if what is None:
        return {}
    sparse = load_model(source, arch=arch)  # the sparse model: budgets are fractions of it
    full = count_flops(sparse, input_size_of(sparse)) if what == "flops" else count_params(sparse)
    target = parse_budget(getattr(args, f"target_{what}"), full, what)
    return {f"target_{what}": float(full * (target / full) ** (i / n))}


def prune_and_evaluate(ns: argparse.Namespace, heading: str = "") -> None:
    """Rank 0's stage: prune ``ns.checkpoint`` into ``ns.save``/pruned.pth (unless done) and
    evaluate it right after the cut into eval.json (unless done)."""
    pruned, evaluated = ns.save / "pruned.pth", ns.save / "eval.json"
    print("== prune ==" + heading)
    if pruned.exists():
        print(f"{pruned} exists: skipping")
    else:
        cmd_prune(ns)
    if not evaluated.exists():
        m = cmd_eval(argparse.Namespace(**{**vars(ns), "checkpoint": pruned}))
        write_text(evaluated, json.dumps({"acc": m["acc"], "loss": m["loss"], "count": m["count"]}))


def run_pipeline(args: argparse.Namespace) -> None:
    root = args.save
    check_output(root / "x", False)  # only refuses a --save that is a file or unwritable
    device = device_for(args)

    # the later stages read checkpoints, which name their arch; your own code's arch is run
    # only when named, so it is named again for them
    arch = args.arch if is_user_code(args.arch) else None

    def stage(name: str, **changes) -> argparse.Namespace:
        ns = copy.copy(args)
        ns.save, ns.resume, ns.overwrite = root / name, "auto", False
        for k, v in changes.items():
            setattr(ns, k, v)
        return ns

    with distributed_session(device.type == "cuda") as dist, contextlib.ExitStack() as held:
        say = print if dist.is_main else (lambda *a, **k: None)

        def lock_root() -> None:  # one pipeline per folder; its stages lock their own folders
            if dist.is_main and root.is_dir() and not held_lock:
                held.enter_context(RunLock(root))
                held_lock.append(True)

        held_lock: list[bool] = []
        lock_root()
        if args.baseline:
            say("== baseline (no sparsity) ==")
            cmd_train(stage(BASELINE, sparsity=0.0))
            lock_root()
        say("== sparsity training ==")
        cmd_train(stage(SPARSE))
        lock_root()
        source = root / SPARSE / "best.pth"
        for i in range(1, args.iterations + 1):  # the last iteration's folders are pruned/, finetuned/
            where = "" if i == args.iterations else f"iter{i}/"
            pruned = root / f"{where}{PRUNED}" / "pruned.pth"
            share = budget_share(args, i, root / SPARSE / "best.pth", arch)
            heading = f" (iteration {i} of {args.iterations})" if args.iterations > 1 else ""
            ns = stage(f"{where}{PRUNED}", checkpoint=source, arch=arch, depth=None, **share)
            on_main(dist, functools.partial(prune_and_evaluate, ns, heading))
            say("== fine-tune ==")
            cmd_finetune(stage(f"{where}{FINETUNED}", checkpoint=pruned, arch=arch, depth=None, sparsity=0.0,
                               sparsity_target=None, epochs=args.finetune_epochs or args.epochs,
                               lr=args.finetune_lr or args.lr))
            source = root / f"{where}{FINETUNED}" / "best.pth"

        def report() -> None:
            print("== report ==")
            cmd_report(argparse.Namespace(run=root, repeats=args.repeats, cpu=args.cpu,
                                          device=args.device, arch=arch))

        on_main(dist, report)
