"""Depth from slimming: what removing the branches a cut empties buys at batch 1, against the
same cuts with every branch kept at one channel (``remove_branches=False``, the paper's way).

For each network (random weights, gammas shaped as sparsity training leaves them, and a share
``--emptied`` of the branches that may be removed driven to zero, as sparsity training empties
some), at ``--size`` px, batch 1, on the CPU at each of ``--threads``:
- the same threshold cut both ways (the emptied branches cut whole, nothing else): FLOPs kept
  and latency (the pruned/original ratio of interleaved medians), and their quotient, speed-up
  over FLOPs saved (1.0: the network runs as much faster as it computes less);
- ``target_latency=--target`` both ways: FLOPs kept at that latency (more kept: fewer channels
  cut for the same speed), the latency measured again, speed-up / FLOPs.

    python benchmarks/branches.py --nets resnet50 mobilenet_v2 --threads 1 2 --out runs/branches.json
"""

from __future__ import annotations

import json
import random
import sys
import warnings
from pathlib import Path

import torch
from common import guarded, parser, positive_int, sparsity_shaped
from torch import nn

import slimming
from slimming.measure import timing
from slimming.measure.latency import time_interleaved
from slimming.measure.stats import count_flops
from slimming.pruning import plans
from slimming.pruning.importance import get_importance


def _convnext_gated():
    import timm
    model = timm.create_model("convnext_atto").eval()
    slimming.add_gates(model, torch.randn(1, 3, 64, 64))
    return model


def _yolo():
    sys.path.insert(0, str(Path(__file__).parent))
    from detector import TinyYOLO
    return TinyYOLO()


def _tv(name):
    def build():
        import torchvision
        return getattr(torchvision.models, name)()
    return build


NETS = {"resnet50": (_tv("resnet50"), ("fc",)), "mobilenet_v2": (_tv("mobilenet_v2"), ("classifier.1",)),
        "efficientnet_b0": (_tv("efficientnet_b0"), ("classifier.1",)),
        "convnext_atto_gated": (_convnext_gated, ("head.fc",)), "tiny_yolo": (_yolo, ("head",))}


def empty_branches(model: nn.Module, x: torch.Tensor, ignore, share: float, seed: int) -> list[str]:
    """Scale the factors of a random ``share`` of the branches ``prune`` may remove by 1e-3 (as
    sparsity training leaves an emptied branch); their factor layers' names."""
    plan = plans.traced_plan(model, get_importance("bn-max"), x, ignore)
    factors = sorted({n for names in plan.removable.values() for n in names
                      if slimming.layers.rules.is_factor_layer(model.get_submodule(n))})
    groups = [sorted(n for n in names if n in factors) for names in plan.removable.values()]
    chosen = random.Random(seed).sample(groups, max(1, round(share * len(groups))))
    with torch.no_grad():
        for names in chosen:
            for n in names:
                model.get_submodule(n).weight.mul_(1e-3)
    return [n for names in chosen for n in names]


def measure(original: nn.Module, pruned: nn.Module, x: torch.Tensor, repeats: int) -> dict:
    a, b = time_interleaved([original, pruned], (x,), repeats)
    latency = timing.ratio(a, b)
    flops = count_flops(pruned, inputs=(x,)) / count_flops(original, inputs=(x,))
    return {"latency": round(latency.value, 4), "latency_spread": round(latency.spread, 4),
            "flops_kept": round(flops, 4), "speedup_over_flops": round(flops / latency.value, 3)}


def one(net: str, threads: int, args) -> dict:
    make, ignore = NETS[net]
    torch.manual_seed(args.seed)
    model = make().eval()
    sparsity_shaped(model, seed=args.seed)
    x = torch.randn(1, 3, args.size, args.size)
    torch.set_num_threads(threads)
    emptied = empty_branches(model, x, ignore, args.emptied, args.seed)
    row = {"net": net, "threads": threads, "size": args.size, "emptied_factors": len(emptied)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for remove in (True, False):
            key = "removed" if remove else "kept"
            same = slimming.prune(model, threshold=2e-3, example_inputs=x, ignore=ignore, compensate=False,
                                  remove_branches=remove)
            row[f"threshold_{key}"] = {**measure(model, same.model, x, args.repeats),
                                       "layers_removed": len(same.removed)}
            lat = slimming.prune(model, target_latency=args.target, example_inputs=x, ignore=ignore,
                                 compensate=False, remove_branches=remove)
            row[f"latency_{key}"] = {**measure(model, lat.model, x, args.repeats),
                                     "layers_removed": len(lat.removed), "asked": args.target,
                                     "prune_said": round(lat.budget.ratio, 4)}
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--nets", nargs="+", default=list(NETS), choices=list(NETS))
    p.add_argument("--threads", nargs="+", type=positive_int, default=[1, 2])
    p.add_argument("--size", type=positive_int, default=224)
    p.add_argument("--emptied", type=float, default=0.25, help="the share of removable branches emptied")
    p.add_argument("--target", type=float, default=0.5)
    p.add_argument("--repeats", type=positive_int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    rows = []
    for net in args.nets:
        for threads in args.threads:
            rows.append(one(net, threads, args))
            if args.out:
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    sys.exit(guarded(main))
