"""Pruning without the collapse, on the quarter-width VGG-11 of RESULTS.md (CIFAR-10 JPEG copy,
CPU), and budgets instead of percents.

Part A: right after pruning, on the same sparse checkpoints (15 epochs at --sparsity 3e-3 and
1e-3), at 50%, 60% and 70%: the paper's cut, compensated, and compensated + BatchNorm
recalibration (and the paper's cut + recalibration, to see each repair alone).
Part B: the whole path with the controller: a baseline trained as many epochs as the path in
all; sparsity training steered to a target fraction of |gamma| under 1e-2; prune to a FLOPs
budget of 0.5 (compensated, BatchNorm recalibrated, as pipeline does); a short fine-tune.
Part C: --target-flops 0.5 on VGG-19, ResNet-164 and DenseNet-40 (sparsity-shaped gammas): the
FLOPs achieved against the budget.
Part D: --round-to 8 and 16 against plain widths for the same FLOPs budget on VGG-19: CPU
latency at batch 1 and 64, contiguous and channels-last.

    python benchmarks/budget_repair.py [--data-root ../shared/data/cifar10-jpeg] [--out runs/budget]
                                       [--parts ABCD]
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch
from common import accuracy, guarded, loaders_like, out_folder, parser, positive_int, run, sparsity_shaped

import slimming
from slimming import models
from slimming.measure.stats import count_flops, count_params, latency_ms
from slimming.pruning.repair import recalibrate_bn

CFG = "16,M,32,M,64,64,M,128,128,M,128,128"
RECALIBRATE = 50  # batches of 64 training images


def part_a(root: Path, out: Path, epochs: int) -> dict:
    data = ["--dataset", "imagefolder", "--data-root", root, "--cpu", "--seed", "0"]
    rows = {}
    for strength in (3e-3, 1e-3):
        save = out / f"sparse{strength:g}"
        run("train", "--arch", "vgg", "--cfg", CFG, "--epochs", epochs, "--sparsity", strength, *data,
            "--resume", "auto", "--save", save)
        sparse = slimming.load_model(save / "last.pth")
        train, test = loaders_like(root, slimming.load_checkpoint(save / "last.pth"))
        gammas = torch.cat([bn.weight.detach().abs() for bn in slimming.prunable_bns(sparse)])
        row = {"sparse": accuracy(sparse, test), "gamma_lt_1e-2": (gammas < 1e-2).float().mean().item()}
        for p in (0.5, 0.6, 0.7):
            plain = slimming.prune(sparse, percent=p, compensate=False)
            comp = slimming.prune(sparse, percent=p)
            cell = {"plain": accuracy(plain.model, test), "compensated": accuracy(comp.model, test),
                    "compensation": comp.compensation}
            recalibrate_bn(plain.model, train, RECALIBRATE)
            recalibrate_bn(comp.model, train, RECALIBRATE)
            cell["plain+recalibrated"] = accuracy(plain.model, test)
            cell["compensated+recalibrated"] = accuracy(comp.model, test)
            row[str(p)] = cell
            print(strength, p, cell, flush=True)
        rows[f"{strength:g}"] = row
    return rows


def part_b(root: Path, out: Path, epochs: int, ft_epochs: int, target: float) -> dict:
    data = ["--dataset", "imagefolder", "--data-root", root, "--cpu", "--seed", "0"]
    seconds = {}
    seconds["baseline"] = run("train", "--arch", "vgg", "--cfg", CFG, "--epochs", epochs + ft_epochs,
                              *data, "--resume", "auto", "--save", out / "baseline")
    seconds["sparse"] = run("train", "--arch", "vgg", "--cfg", CFG, "--epochs", epochs, "--sparsity", "1e-4",
                            "--sparsity-target", target, *data, "--resume", "auto", "--save", out / "target")
    seconds["prune"] = run("prune", "--checkpoint", out / "target" / "last.pth", "--target-flops", "0.5",
                           "--recalibrate-bn", RECALIBRATE, "--save", out / "target-pruned", "--overwrite",
                           "--cpu")
    seconds["finetune"] = run("finetune", "--checkpoint", out / "target-pruned" / "pruned.pth",
                              "--epochs", ft_epochs, "--lr", "0.01", *data, "--resume", "auto",
                              "--save", out / "target-ft")
    _, test = loaders_like(root, slimming.load_checkpoint(out / "baseline" / "last.pth"))
    result = {}
    for name, path in (("baseline", out / "baseline" / "last.pth"), ("sparse", out / "target" / "last.pth"),
                       ("pruned", out / "target-pruned" / "pruned.pth"),
                       ("finetuned", out / "target-ft" / "last.pth")):
        model = slimming.load_model(path)
        result[name] = {"acc": accuracy(model, test), "params": count_params(model),
                        "flops": count_flops(model), "seconds": round(seconds.get(name, 0))}
    metrics = [json.loads(line) for line in (out / "target" / "metrics.jsonl").read_text().splitlines()]
    result["controller"] = [(r["epoch"], r["sparsity"], r["gamma_lt_1e-2"]) for r in metrics]
    return result


def part_c() -> dict:
    rows = {}
    for arch, options in (("vgg", {"depth": 19}), ("preresnet", {"depth": 164}), ("densenet", {"depth": 40})):
        model = models.build(arch, **options).eval()
        sparsity_shaped(model, small=0.6)
        full = count_flops(model)
        start = time.perf_counter()
        result = slimming.prune(model, target_flops=0.5)
        rows[f"{arch}-{options['depth']}"] = {"full": full, "budget": 0.5 * full,
                                              "achieved": result.budget.achieved,
                                              "seconds": round(time.perf_counter() - start, 2)}
    return rows


def part_d(rounds: int = 7) -> dict:
    """Latency (ms) of each network, measured in ``rounds`` interleaved rounds (every network
    and setting once a round, 20 timed passes each); the median over the rounds, so that a
    disturbance on a shared machine moves one round, not one network's figure."""
    torch.manual_seed(0)
    model = models.build("vgg", depth=19).eval()
    sparsity_shaped(model, small=0.7)
    rows = {"full": model}
    for k in (1, 8, 16):
        cut = slimming.prune(model, target_flops=0.5, round_to=k, compensate=False)
        rows[f"round_to {k}"] = cut.model.eval()
    settings = [(f"b{b}{'_channels_last' if cl else ''}", b, cl) for b in (1, 64) for cl in (False, True)]
    samples = {(name, key): [] for name in rows for key, _, _ in settings}
    for _ in range(rounds):
        for name, m in rows.items():
            for key, b, cl in settings:
                samples[name, key].append(latency_ms(m, b, repeats=20, channels_last=cl))
    table = {}
    for name, m in rows.items():
        table[name] = {"flops": count_flops(m), "params": count_params(m),
                       **{key: statistics.median(samples[name, key]) for key, _, _ in settings}}
        print(name, table[name], flush=True)
    return table


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--data-root", type=Path, default=Path("../shared/data/cifar10-jpeg"))
    ap.add_argument("--out", type=out_folder, default=Path("runs/budget"))
    ap.add_argument("--parts", default="ABCD")
    ap.add_argument("--epochs", type=positive_int, default=15)
    ap.add_argument("--ft-epochs", type=positive_int, default=8)
    ap.add_argument("--target", type=float, default=0.5, help="--sparsity-target of part B")
    args = ap.parse_args()
    torch.set_num_threads(2)
    results = {}
    if "C" in args.parts:
        results["C"] = part_c()
        print(json.dumps(results["C"], indent=1), flush=True)
    if "D" in args.parts:
        results["D"] = part_d()
    if "A" in args.parts:
        results["A"] = part_a(args.data_root, args.out, args.epochs)
    if "B" in args.parts:
        results["B"] = part_b(args.data_root, args.out, args.epochs, args.ft_epochs, args.target)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"results_{args.parts}.json").write_text(json.dumps(results, indent=1, default=str))
    print(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    sys.exit(guarded(main))
