"""slimming against Torch-Pruning on the same sparsity-trained checkpoint and the same rule:
one global ranking of BatchNorm |gamma|, a group's channels scored by the mean over its
BatchNorms (no per-group normalisation), the same fraction of channels removed, the classifier
kept. Prints the kept channels per BatchNorm side by side, accuracy right after pruning, and
the in-process prune time of each (median of repeated runs, in one process: a ratio).

Torch-Pruning is installed for this benchmark only (``pip install torch-pruning``); it is
never a dependency of slimming.

    python benchmarks/vs_torch_pruning.py --checkpoint runs/own/resnet18/sparse/last.pth \\
        [--data-root ../shared/data/cifar10-jpeg] [--percent 0.5] [--repeats 5]
"""

from __future__ import annotations

import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from common import accuracy, guarded, loaders_like, parser, positive_int
from torch import nn

import slimming
from slimming.pruning.importance import BNScale


def timed(fns, repeats: int):
    """Run the functions in turn, ``repeats`` rounds (so that a busy moment of the machine
    falls on both), and give each one's last result and median seconds."""
    times: list[list[float]] = [[] for _ in fns]
    outs = [None] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            outs[i] = fn()
            times[i].append(time.perf_counter() - start)
    return outs, [statistics.median(t) for t in times]


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--data-root", type=Path, default=Path("../shared/data/cifar10-jpeg"))
    ap.add_argument("--percent", type=float, default=0.5)
    ap.add_argument("--repeats", type=positive_int, default=21)
    args = ap.parse_args()
    try:
        import torch_pruning as tp  # the peer measured here; not a dependency of slimming
    except ImportError:
        ap.error("this comparison needs Torch-Pruning: pip install torch-pruning")
    torch.set_num_threads(2)
    ckpt = slimming.load_checkpoint(args.checkpoint)
    model = slimming.load_model(args.checkpoint).eval()
    example = torch.zeros(1, *model.input_size)

    def ours():
        return slimming.prune(model, percent=args.percent, importance=BNScale("mean"),
                              example_inputs=example).model

    def theirs(m=None):
        """Torch-Pruning prunes in place: a copy first, to leave the model as slimming does."""
        m = copy.deepcopy(model) if m is None else m
        classifier = [mod for mod in m.modules() if isinstance(mod, nn.Linear)][-1]
        pruner = tp.pruner.BNScalePruner(
            m, example, importance=tp.importance.BNScaleImportance(group_reduction="mean", normalizer=None),
            global_pruning=True, pruning_ratio=args.percent, ignored_layers=[classifier])
        pruner.step()
        return m

    ours(), theirs()  # warm-up: imports, first-call costs
    (a, b), (t_ours, t_theirs) = timed([ours, theirs], args.repeats)
    copies = iter([copy.deepcopy(model) for _ in range(args.repeats)])
    _, (t_in_place,) = timed([lambda: theirs(next(copies))], args.repeats)  # without its copy
    loader = loaders_like(args.data_root, ckpt, 256)[1]
    names = [n for n, m in model.named_modules() if isinstance(m, nn.BatchNorm2d)]
    rows = [(n, model.get_submodule(n).num_features, a.get_submodule(n).num_features,
             b.get_submodule(n).num_features) for n in names]
    result = {
        "checkpoint": str(args.checkpoint), "percent": args.percent,
        "channels": {"before": sum(r[1] for r in rows), "slimming": sum(r[2] for r in rows),
                     "torch_pruning": sum(r[3] for r in rows)},
        "params": {"before": sum(p.numel() for p in model.parameters()),
                   "slimming": sum(p.numel() for p in a.parameters()),
                   "torch_pruning": sum(p.numel() for p in b.parameters())},
        "acc": {"before": accuracy(model, loader), "slimming": accuracy(a, loader),
                "torch_pruning": accuracy(b, loader)},
        "prune_seconds": {"slimming": t_ours, "torch_pruning": t_theirs,
                          "ratio_slimming_over_torch_pruning": t_ours / t_theirs,
                          "torch_pruning_in_place_without_its_copy": t_in_place},
        "layers": rows,
        "torch_pruning_version": tp.__version__,
    }
    print("| BatchNorm | before | slimming | Torch-Pruning |\n|---|---|---|---|")
    for n, before, ours_kept, theirs_kept in rows:
        flag = "" if ours_kept == theirs_kept else " *"
        print(f"| {n} | {before} | {ours_kept} | {theirs_kept}{flag} |")
    print(json.dumps({k: v for k, v in result.items() if k != "layers"}, indent=1))
    out = args.checkpoint.parent.parent / f"vs_torch_pruning_{args.percent}.json"
    out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    sys.exit(guarded(main))
