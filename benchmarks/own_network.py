"""Your own network, on real data: torchvision ResNet-18 and MobileNetV2 (adapted only through
their constructor arguments: num_classes=10) on the CIFAR-10 JPEG copy, 32x32, on the CPU.

For each: sparsity training, then pruning at two percents; accuracy right after pruning with
the group score ``max`` (the default) against ``mean``; then, with ``max``, a short fine-tune;
accuracy, parameters, FLOPs and CPU latency (batch 1 and 64) at every stage. Every stage is the
command a user would type; the group-score comparison uses the Python API on the same
checkpoint.

    python benchmarks/own_network.py [--data-root ../shared/data/cifar10-jpeg] [--out runs/own]
                                     [--archs resnet18,mobilenet_v2] [--epochs 5] [--ft-epochs 2]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from common import accuracy, guarded, loaders_like, out_folder, parser, positive_int, run

import slimming
from slimming.measure.stats import model_stats
from slimming.pruning.importance import BNScale


def describe(model) -> dict:
    s = model_stats(model.eval(), tuple(model.input_size), repeats=20)
    return {"params": s["params"], "flops": s["flops"], "latency_b1_ms": s["latency_ms"][1],
            "latency_b64_ms": s["latency_ms"][64]}


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--data-root", type=Path, default=Path("../shared/data/cifar10-jpeg"))
    ap.add_argument("--out", type=out_folder, default=Path("runs/own"))
    ap.add_argument("--archs", default="resnet18,mobilenet_v2")
    ap.add_argument("--epochs", type=positive_int, default=5)
    ap.add_argument("--ft-epochs", type=positive_int, default=2)
    ap.add_argument("--sparsity", type=float, default=1e-3)  # RESULTS.md's figures; 1e-2 was too strong
    ap.add_argument("--percents", default="0.3,0.5")
    args = ap.parse_args()
    percents = [float(p) for p in args.percents.split(",")]
    data = ["--dataset", "imagefolder", "--data-root", args.data_root, "--cpu", "--batch-size", "128"]
    results = {}
    for arch in args.archs.split(","):
        out = args.out / arch
        seconds = run("train", "--arch", f"torchvision:{arch}", *data, "--epochs", args.epochs,
                      "--sparsity", args.sparsity, "--sched", "cosine", "--seed", "0",
                      "--save", out / "sparse", "--resume", "auto")
        ckpt = slimming.load_checkpoint(out / "sparse" / "last.pth")
        sparse = slimming.load_model(out / "sparse" / "last.pth")
        loader = loaders_like(args.data_root, ckpt, 256)[1]
        gammas = torch.cat([m.weight.detach().abs() for m in sparse.modules()
                            if isinstance(m, torch.nn.BatchNorm2d)])
        row = {"train_seconds": round(seconds),  # 0 when resumed after it finished
               "sparse": {"acc": accuracy(sparse, loader), **describe(sparse)},
               "gamma_lt_1e-2": (gammas < 1e-2).float().mean().item(), "pruned": {}}
        for p in percents:  # the group score: max (default) against mean, no fine-tune
            scores = {}
            for reduce in ("max", "mean"):
                result = slimming.prune(sparse, percent=p, importance=BNScale(reduce))
                scores[reduce] = {"acc": accuracy(result.model, loader), **describe(result.model)}
            run("prune", "--checkpoint", out / "sparse" / "last.pth", "--percent", p, "--save",
                out / f"pruned{p}", "--overwrite", "--cpu")
            ft_seconds = run("finetune", "--checkpoint", out / f"pruned{p}" / "pruned.pth", *data,
                             "--epochs", args.ft_epochs, "--lr", "0.01", "--sched", "cosine", "--seed", "0",
                             "--save", out / f"ft{p}", "--resume", "auto")
            ft = slimming.load_model(out / f"ft{p}" / "last.pth")
            row["pruned"][str(p)] = {"no_finetune": scores, "finetune_seconds": round(ft_seconds),
                                     "finetuned": {"acc": accuracy(ft, loader), **describe(ft)}}
        results[arch] = row
        print(json.dumps({arch: row}, indent=1), flush=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    sys.exit(guarded(main))
