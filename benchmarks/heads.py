"""Attention heads cut whole, on transformers others wrote (timm): each network gets its gates
(``slimming.add_gates``: one per MLP hidden channel, one per head), factors set as sparsity
training leaves them (seeded, a fraction near zero), and is pruned by a percent of its factors.
Per network: heads before and after, parameters, the check's largest relative difference
against the original with the cut factors zeroed, and CPU latency of the pruned network over the
original's (batch 8, the median of ``--repeats`` runs of each, interleaved, in one process).

Run: ``python benchmarks/heads.py`` (about four minutes on two cores)."""

from __future__ import annotations

import statistics
import time
import warnings

import torch
from common import guarded, parser, positive_int, sparsity_shaped

import slimming
from slimming.cli.parser import fraction
from slimming.layers.gates import gated_layers

NETWORKS = ["vit_tiny_patch16_224", "deit_small_patch16_224", "swin_tiny_patch4_window7_224",
            "eva02_tiny_patch14_224", "beit_base_patch16_224"]


def latency(model: torch.nn.Module, x: torch.Tensor) -> float:
    with torch.no_grad():
        start = time.perf_counter()
        model(x)
        return time.perf_counter() - start


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--models", default=",".join(NETWORKS), help="timm model names, comma-separated")
    p.add_argument("--percent", type=fraction, default=0.5, help="the fraction of factors cut (as --percent)")
    p.add_argument("--repeats", type=positive_int, default=5, help="latency runs of each network")
    args = p.parse_args()
    import timm

    torch.set_num_threads(2)
    print("| network | heads before | heads after | attentions that lost heads | parameters before -> "
          "after | check (relative difference) | latency pruned / original |")
    print("|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        torch.manual_seed(0)
        model = timm.create_model(name, pretrained=False, num_classes=10).eval()
        x = torch.randn(8, 3, 224, 224)
        slimming.add_gates(model, x[:1])
        heads = gated_layers(model, heads=True)
        sparsity_shaped(model, small=0.5)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                result = slimming.prune(model, percent=args.percent, example_inputs=x[:1], compensate=False)
            except slimming.SlimmingError as e:
                print(f"| {name} | {sum(heads.values())} | refused: {str(e)[:120]} | | | | |")
                continue
        after = {n: int(result.masks[f"{n}.slimming_gate"].sum()) for n in heads}
        times = {"original": [], "pruned": []}
        for _ in range(args.repeats):
            times["original"].append(latency(model, x))
            times["pruned"].append(latency(result.model, x))
        ratio = statistics.median(times["pruned"]) / statistics.median(times["original"])
        before_p = sum(t.numel() for t in model.parameters())
        after_p = sum(t.numel() for t in result.model.parameters())
        print(f"| {name} | {sum(heads.values())} | {sum(after.values())} | "
              f"{sum(after[n] < heads[n] for n in heads)} of {len(heads)} | {before_p / 1e6:.2f}M -> "
              f"{after_p / 1e6:.2f}M | {result.verified:.1e} | {ratio:.2f} |", flush=True)


if __name__ == "__main__":
    raise SystemExit(guarded(main))
