"""Accuracy at equal latency, the result users choose by: on the CIFAR-10 copy, a network is
sparsity-trained (``slimming train``), then cut to the same measured latency four ways and
fine-tuned the same way:
- ``target_latency=L`` (slimming: importance per millisecond saved, measured; a residual branch
  cut whole is removed), and the same with every branch kept at one channel
  (``remove_branches=False``: ``latency_branches_kept``);
- ``target_flops=F``, F bisected until the cut's measured latency is the latency cut's
  (slimming's global |gamma| ranking, aimed at FLOPs);
- Torch-Pruning's magnitude (L1) and Taylor pruners, their ratio bisected the same way
  (installed for this benchmark only: ``pip install torch-pruning``; skipped without it).
Latency: the pruned/original ratio of interleaved medians at ``--batch`` images of 32x32, on
the CPU at the threads torch uses. Fine-tune: SGD lr ``--ft-lr`` (cosine), momentum 0.9, weight
decay 5e-4, ``--ft-epochs``, batch 128, the same for all four. Seeds: ``--seeds``; the table
gives each cut's mean and standard deviation over them. ``--cuts``: which of them to run.

    python benchmarks/latency_accuracy.py --data-root ../shared/data/cifar10-jpeg --nets vgg11q resnet18
"""

from __future__ import annotations

import copy
import json
import math
import statistics
import sys
import warnings
from pathlib import Path

import torch
from common import accuracy, guarded, loaders_like, out_folder, parser, positive_int, run
from torch import nn

import slimming
from slimming.errors import SlimmingError
from slimming.io.checkpoint import load_checkpoint, model_from_checkpoint
from slimming.measure import timing
from slimming.measure.latency import time_interleaved
from slimming.measure.stats import count_flops

NETS = {  # name: (train flags, sparsity epochs, sparsity strength, the classifier)
    "vgg11q": (["--arch", "vgg", "--cfg", "16,M,32,M,64,64,M,128,128,M,128,128"], 8, 3e-3, "classifier"),
    "resnet18": (["--arch", "torchvision:resnet18"], 5, 1e-3, "fc"),
    "mobilenet_v2": (["--arch", "torchvision:mobilenet_v2"], 5, 1e-3, "classifier.1"),
}


def ratio(a: nn.Module, b: nn.Module, x: torch.Tensor, repeats: int) -> float:
    """b's latency over a's: the median of the interleaved pairs' ratios."""
    ta, tb = time_interleaved([a, b], (x,), repeats)
    return timing.ratio(ta, tb).value


def bisect(make, model: nn.Module, x: torch.Tensor, goal: float, lo: float, hi: float, steps: int = 6,
           repeats: int = 9):
    """The network ``make(v)`` for v in [lo, hi] (more cut as v grows) whose measured latency
    ratio is closest to ``goal``, by bisection; (network, v, ratio)."""
    best = None
    for _ in range(steps):
        v = (lo + hi) / 2
        try:
            m = make(v)
        except (SlimmingError, RuntimeError, ValueError):  # cut too far (a refusal, a peer's error)
            hi = v
            continue
        r = ratio(model, m, x, repeats)
        if best is None or abs(r - goal) < abs(best[2] - goal):
            best = (m, v, r)
        lo, hi = (v, hi) if r > goal else (lo, v)
    return best


def peer_cut(model: nn.Module, v: float, how: str, ignore, batch) -> nn.Module:
    import torch_pruning as tp

    m = copy.deepcopy(model).eval()
    skip = [mod for n, mod in m.named_modules() if n in ignore]
    imp = tp.importance.MagnitudeImportance(p=1) if how == "magnitude" else tp.importance.TaylorImportance()
    pruner = tp.pruner.MagnitudePruner(m, batch[0][:1], importance=imp, pruning_ratio=v,
                                       ignored_layers=skip, global_pruning=True)
    if how == "taylor":
        m.zero_grad()
        nn.functional.cross_entropy(m(batch[0]), batch[1]).backward()
    pruner.step()
    m.zero_grad(set_to_none=True)
    return m


def finetune(model: nn.Module, train_loader, epochs: int, lr: float, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)
    steps = epochs * len(train_loader)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * s / steps)))
    model.train()
    for _ in range(epochs):
        for images, labels in train_loader:
            loss = nn.functional.cross_entropy(model(images), labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
    return model.eval()


CUTS = ("target_latency", "latency_branches_kept", "target_flops", "tp_magnitude", "tp_taylor")


def one(net: str, seed: int, args) -> dict:
    flags, epochs, strength, classifier = NETS[net]
    out = args.out / net / f"seed{seed}"
    data = ["--dataset", "imagefolder", "--data-root", args.data_root, "--cpu", "--batch-size", "128"]
    run("train", *flags, *data, "--epochs", epochs, "--sparsity", strength, "--sched", "cosine",
        "--seed", seed, "--save", out / "sparse", "--resume", "auto")
    ckpt = load_checkpoint(out / "sparse" / "last.pth")
    model = model_from_checkpoint(ckpt, out / "sparse" / "last.pth").eval()
    train_loader, test_loader = loaders_like(args.data_root, ckpt, 128)
    x = torch.randn(args.batch, 3, 32, 32)
    batch = next(iter(train_loader))
    row = {"net": net, "seed": seed, "sparse_acc": accuracy(model, test_loader), "asked": args.target}
    ignore = () if net == "vgg11q" else (classifier,)  # a family's own surgery keeps its classifier's outputs
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lat = slimming.prune(model, target_latency=args.target, example_inputs=x, ignore=ignore)
        goal = lat.budget.ratio
        cuts = {"target_latency": (lat.model, args.target)}
        row["branches_removed"] = len({n.rpartition(".")[0] for n, what in lat.removed.items()
                                       if what == "Constant"})
        if "latency_branches_kept" in args.cuts:
            kept = slimming.prune(model, target_latency=args.target, example_inputs=x, ignore=ignore,
                                  remove_branches=False)
            cuts["latency_branches_kept"] = (kept.model, args.target)
        if "target_flops" in args.cuts:
            fl = bisect(lambda c: slimming.prune(model, target_flops=1 - c, example_inputs=x[:1],
                                                 ignore=ignore).model, model, x, goal, 0.02, 0.95)
            cuts["target_flops"] = (fl[0], 1 - fl[1])  # bisected on the share cut, 1 - F
        try:
            import torch_pruning  # noqa: F401
        except ImportError:
            pass
        else:
            for how in [h for h in ("magnitude", "taylor") if f"tp_{h}" in args.cuts]:
                got = bisect(lambda v, how=how: peer_cut(model, v, how, (classifier,), batch), model, x,
                             goal, 0.0, 0.95)
                cuts[f"tp_{how}"] = (got[0], got[1])
    flops0 = count_flops(model, (3, 32, 32))
    for name, (m, v) in cuts.items():
        r = ratio(model, m, x, args.repeats)
        before = accuracy(m, test_loader)
        after = accuracy(finetune(m, train_loader, args.ft_epochs, args.ft_lr, seed), test_loader)
        row[name] = {"knob": v, "latency_ratio": r, "flops_kept": count_flops(m, (3, 32, 32)) / flops0,
                     "params": sum(p.numel() for p in m.parameters()), "acc_cut": before, "acc_ft": after}
        print(f"{net} seed {seed} {name:<15} latency {r:.3f} FLOPs kept {row[name]['flops_kept']:.3f} "
              f"top-1 cut {before:.2f}% fine-tuned {after:.2f}%", flush=True)
    return row


def _mean_sd(rows: list[dict], key: str, digits: int = 3, unit: str = "") -> str:
    v = [r[key] for r in rows]
    sd = statistics.stdev(v) if len(v) > 1 else 0.0
    return f"{statistics.mean(v):.{digits}f} +- {sd:.{digits}f}{unit}"


def table(rows: list[dict]) -> str:
    lines = ["| network | cut | latency (of the original) | FLOPs kept | top-1 after the cut | "
             "top-1 fine-tuned | seeds |", "|---|---|---|---|---|---|---|"]
    for net in dict.fromkeys(r["net"] for r in rows):
        mine = [r for r in rows if r["net"] == net]
        for cut in CUTS:
            got = [r[cut] for r in mine if cut in r]
            if got:
                cells = [_mean_sd(got, "latency_ratio"), _mean_sd(got, "flops_kept"),
                         _mean_sd(got, "acc_cut", 2, "%"), _mean_sd(got, "acc_ft", 2, "%"), str(len(got))]
                lines.append(f"| {net} | {cut} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--data-root", type=Path, default=Path("../shared/data/cifar10-jpeg"))
    p.add_argument("--out", type=out_folder, default=Path("runs/latency_accuracy"))
    p.add_argument("--nets", nargs="+", default=list(NETS), choices=list(NETS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--target", type=float, default=0.5)
    p.add_argument("--batch", type=positive_int, default=32)
    p.add_argument("--repeats", type=positive_int, default=15)
    p.add_argument("--ft-epochs", type=positive_int, default=2)
    p.add_argument("--ft-lr", type=float, default=0.01)
    p.add_argument("--cuts", nargs="+", default=list(CUTS), choices=CUTS, help="the cuts to compare "
                   "(target_latency always runs: the others are held to its latency)")
    args = p.parse_args()
    rows = []
    for net in args.nets:
        for seed in args.seeds:
            rows.append(one(net, seed, args))
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "rows.json").write_text(json.dumps(rows, indent=1))
    print(table(rows))


if __name__ == "__main__":
    sys.exit(guarded(main))
