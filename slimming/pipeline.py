"""``slimming pipeline``: sparsity training -> prune -> fine-tune -> report, each stage in its own
sub-folder of --save; rerun the same command to pick up where it stopped (finished stages are
skipped, an interrupted one resumes).

Under torchrun every rank trains (DistributedDataParallel, one process group for all stages),
but only rank 0 prunes, evaluates the pruned network, writes the report and prints; the other
ranks wait until rank 0 is done and then read what it wrote. If rank 0 fails, they stop too.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
from collections.abc import Callable

import torch.distributed as torch_dist

from models.external import is_user_code

from .commands import cmd_eval, cmd_finetune, cmd_prune, cmd_report, cmd_train
from .distributed import DistInfo, distributed_session
from .errors import SlimmingError
from .files import RunLock, write_text
from .runs import check_output, device_for


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
            cmd_train(stage("baseline", sparsity=0.0))
            lock_root()
        say("== sparsity training ==")
        cmd_train(stage("sparse"))
        lock_root()
        pruned = root / "pruned" / "pruned.pth"
        evaluated = root / "pruned" / "eval.json"

        def prune_and_evaluate() -> None:
            print("== prune ==")
            if pruned.exists():
                print(f"{pruned} exists: skipping")
            else:
                cmd_prune(stage("pruned", checkpoint=root / "sparse" / "best.pth", arch=arch, depth=None))
            if not evaluated.exists():
                m = cmd_eval(stage("pruned", checkpoint=pruned, arch=arch, depth=None))
                write_text(evaluated, json.dumps({"acc": m["acc"], "loss": m["loss"], "count": m["count"]}))

        on_main(dist, prune_and_evaluate)
        say("== fine-tune ==")
        cmd_finetune(stage("finetuned", checkpoint=pruned, arch=arch, depth=None, sparsity=0.0,
                           epochs=args.finetune_epochs or args.epochs,
                           lr=args.finetune_lr or args.lr))

        def report() -> None:
            print("== report ==")
            cmd_report(argparse.Namespace(run=root, repeats=args.repeats, cpu=args.cpu,
                                          device=args.device, arch=arch))

        on_main(dist, report)
