"""Gates on a network without normalisation, on real data (issue 34's fifth class, "measure it"):
does a gate trained with the L1 term rank channels where no BatchNorm scores them?

A quarter-width VGG-11 without BatchNorm (cfg 16,M,32,M,64,64,M,128,128,M,128,128, global
average pooling, one linear layer) on the CIFAR-10 JPEG copy, at 32x32. ``add_gates(model, x,
everywhere=True)`` gates every width; the network trains ``--epochs`` epochs (SGD, momentum 0.9,
weight decay on every weight, as the paper's objection asks, cosine learning rate) with the L1
term on the gates (``slimming.Sparsity``, ``--sparsity``). Then ``--percent`` of the gated
channels are cut twice: by |gate| (``slimming.prune``), and at random with the same number cut
in every layer (the control: what the gates' ranking is worth beyond the widths it chose).
Each cut is scored right after it (no compensation, no fine-tune) and after ``--ft-epochs`` of
fine-tuning at a tenth of the learning rate. Seeds ``--seeds``; one process, 2 threads.

    python benchmarks/no_norm_gates.py [--data-root ../shared/data/cifar10-jpeg] [--epochs 4]
        [--ft-epochs 1] [--sparsity 5e-3] [--percent 0.5] [--seeds 0,1,2] [--out runs/no_norm.json]
"""

from __future__ import annotations

import copy
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from common import accuracy, guarded, parser, positive_int
from torch import nn

import slimming
from slimming.data import build_loaders

CFG = [16, "M", 32, "M", 64, 64, "M", 128, 128, "M", 128, 128]


def vgg_without_norm(classes: int = 10) -> nn.Module:
    layers, width = [], 3
    for v in CFG:
        if v == "M":
            layers.append(nn.MaxPool2d(2))
        else:
            layers += [nn.Conv2d(width, v, 3, padding=1), nn.ReLU(inplace=True)]
            width = v
    model = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, classes))
    for m in model.modules():  # torchvision's VGG initialisation: without it, no BatchNorm, it does not learn
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            nn.init.zeros_(m.bias)
    return model


def fit(model: nn.Module, loader, epochs: int, lr: float, sparsity: float = 0.0) -> None:
    """``epochs`` of SGD (momentum 0.9, weight decay 5e-4 on every weight but the gates, a cosine
    learning rate), the L1 term on the gates when ``sparsity``."""
    gates = [p for n, p in model.named_parameters() if "slimming_gate" in n]
    rest = [p for n, p in model.named_parameters() if "slimming_gate" not in n]
    opt = torch.optim.SGD([{"params": rest, "weight_decay": 5e-4}, {"params": gates, "weight_decay": 0.0}],
                          lr=lr, momentum=0.9)
    steps = max(1, epochs * len(loader))
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    l1 = slimming.Sparsity(model, strength=sparsity) if sparsity else None
    model.train()
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            if l1 is not None:
                l1.apply()
            opt.step()
            sched.step()


def random_like(cut: dict[str, int], seed: int):
    """An importance that cuts ``cut[gate]`` channels of each gate's group, chosen at random."""
    gen = torch.Generator().manual_seed(seed)

    def scores(model: nn.Module, group) -> torch.Tensor:
        n = group.size
        count = max((cut.get(name, 0) for name, *_ in group.bns), default=0)
        s = 1.0 + torch.rand(n, generator=gen)
        s[torch.randperm(n, generator=gen)[:count]] = torch.rand(count, generator=gen) * 0.5
        return s
    return scores


def one(seed: int, train, test, args) -> dict:
    torch.manual_seed(seed)
    model = vgg_without_norm()
    x = torch.zeros(1, 3, 32, 32)
    slimming.add_gates(model, x, everywhere=True)
    start = time.perf_counter()
    fit(model, train, args.epochs, 0.02, args.sparsity)
    row = {"seed": seed, "train_s": time.perf_counter() - start, "trained": accuracy(model, test)}
    gates = torch.cat([m.weight.detach().abs().flatten() for n, m in model.named_modules()
                       if n.endswith("slimming_gate")])
    row["gates_under_1e-2"] = float((gates < 1e-2).float().mean())
    model.eval()
    by_gate = slimming.prune(model, percent=args.percent, example_inputs=x, compensate=False)
    cut = {name: int((~keep).sum()) for name, keep in by_gate.masks.items()}
    at_random = slimming.prune(model, percent=args.percent, example_inputs=x, compensate=False,
                               importance=random_like(cut, seed))
    assert {n: int((~k).sum()) for n, k in at_random.masks.items()} == cut  # the same widths
    row["params"] = sum(p.numel() for p in by_gate.model.parameters())
    for key, result in (("gates", by_gate), ("random", at_random)):
        small = copy.deepcopy(result.model)
        row[f"{key}_cut"] = accuracy(small, test)
        fit(small, train, args.ft_epochs, 0.002)
        row[f"{key}_ft"] = accuracy(small, test)
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--data-root", type=Path, default=Path("../shared/data/cifar10-jpeg"))
    p.add_argument("--epochs", type=positive_int, default=4)
    p.add_argument("--ft-epochs", type=positive_int, default=1)
    p.add_argument("--sparsity", type=float, default=5e-3)
    p.add_argument("--percent", type=float, default=0.5)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--out", type=Path, default=Path("runs/no_norm.json"))
    args = p.parse_args()
    torch.set_num_threads(2)
    train, test, _ = build_loaders("imagefolder", args.data_root, 128, seed=0, image_size=32)
    rows = [one(int(s), train, test, args) for s in args.seeds.split(",")]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=2))
    for key in ("trained", "gates_cut", "random_cut", "gates_ft", "random_ft"):
        values = [r[key] for r in rows]
        print(f"{key}: mean {statistics.mean(values):.2f}, range {min(values):.2f}-{max(values):.2f} "
              f"({', '.join(f'{v:.2f}' for v in values)})")


if __name__ == "__main__":
    raise SystemExit(guarded(main))
