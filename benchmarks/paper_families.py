"""Parameters and FLOPs of ResNet-164 and DenseNet-40, before and after slimming 40% and 60%.

No training: the gammas are given the shape sparsity training leaves (per channel, seeded: 60%
near zero, ~1e-3 * N(0, 1); the rest uniform in (0.1, 1)), so which channels go is as random as
it gets while the counts are those of a real run with that share of near-zero gammas. FLOPs come
from ``torch.utils.flop_counter.FlopCounterMode`` on one (1, 3, 32, 32) image: a multiply-add is
two FLOPs, convolutions and the linear layer only (BN, ReLU, pooling are not counted), the
paper's convention. A CPU and a few seconds::

    python benchmarks/paper_families.py
"""

from __future__ import annotations

import torch
from common import parser, sparsity_shaped

from slimming import count_flops, count_params, models, prune

PAPER = {"preresnet": ("ResNet-164", 1.70e6, 4.99e8), "densenet": ("DenseNet-40", 1.02e6, 5.33e8)}


def main() -> None:
    torch.manual_seed(0)
    print(f"{'network':<12} {'pruned':>6} {'params':>9} {'FLOPs':>9} {'params -':>8} {'FLOPs -':>8}"
          f"   paper (unpruned)")
    for arch, (name, paper_params, paper_flops) in PAPER.items():
        model = models.build(arch, num_classes=10)
        sparsity_shaped(model, small=0.6)
        p0, f0 = count_params(model), count_flops(model)
        print(f"{name:<12} {'0%':>6} {p0 / 1e6:>8.2f}M {f0:>9.2e} {'':>8} {'':>8}"
              f"   {paper_params / 1e6:.2f}M, {paper_flops:.2e}")
        for percent in (0.4, 0.6):
            pruned = prune(model, percent=percent).model
            p1, f1 = count_params(pruned), count_flops(pruned)
            print(f"{name:<12} {percent:>6.0%} {p1 / 1e6:>8.2f}M {f1:>9.2e} {1 - p1 / p0:>8.1%} "
                  f"{1 - f1 / f0:>8.1%}")


if __name__ == "__main__":
    parser(__doc__).parse_args()  # no options: --help, and a mistake is refused
    main()
