"""What the default prune pays for its check, per network: the check (``verify.check``) in
forwards of the original at the example's size (median of 15 interleaved pairs, with the
interquartile range), and the whole ``prune`` call with and without the check (median of 5
interleaved pairs). Random weights, sparsity-shaped gammas (seed 0), 224x224, batch 1, 30% of
the channels by ``bn-mean``, no compensation (as the network table prunes).

To compare two checkouts side by side, run it under each in turn (fresh processes, alternating,
so that both see the same machine), e.g. with the older tree's ``slimming/`` on PYTHONPATH:

    python benchmarks/check_cost.py [--nets resnet18 mobilenet_v2 ...] [--threads 2]
    python benchmarks/check_cost.py --table --threads 1    # every network of the network table
"""

from __future__ import annotations

import statistics
import time
import warnings

import torch
from common import parser, positive_int, sparsity_shaped

import slimming
from slimming.pruning import verify

NETS = {
    "resnet18": ("torchvision", "resnet18"), "resnet50": ("torchvision", "resnet50"),
    "mobilenet_v2": ("torchvision", "mobilenet_v2"), "regnet_y_400mf": ("torchvision", "regnet_y_400mf"),
    "efficientnet_b0": ("timm", "efficientnet_b0"), "convnext_atto": ("timm", "convnext_atto"),
    "vit_tiny": ("timm", "vit_tiny_patch16_224"),
}


def build(name: str):
    library, arch = NETS[name]
    if library == "timm":
        import timm
        return timm.create_model(arch, pretrained=False, num_classes=10)
    import torchvision
    return torchvision.models.get_model(arch, weights=None, num_classes=10)


def one(name: str) -> str:
    torch.manual_seed(0)
    model = build(name).eval()
    sparsity_shaped(model, seed=0)
    x = torch.zeros(1, 3, 224, 224)
    options = dict(percent=0.3, example_inputs=x, compensate=False, importance="bn-mean")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = slimming.prune(model, verify=False, **options)
        ratios, calls = [], []
        with torch.no_grad():
            for _ in range(15):
                t0 = time.perf_counter()
                model(x)
                t1 = time.perf_counter()
                verify.check(model, result, x)
                ratios.append((time.perf_counter() - t1) / (t1 - t0))
        for _ in range(5):
            t0 = time.perf_counter()
            slimming.prune(model, verify=False, **options)
            t1 = time.perf_counter()
            slimming.prune(model, **options)
            calls.append((t1 - t0, time.perf_counter() - t1))
    q = statistics.quantiles(ratios, n=4)
    unchecked, checked = (1e3 * statistics.median(c[i] for c in calls) for i in (0, 1))
    check = f"{statistics.median(ratios):.2f} ({q[0]:.2f}-{q[2]:.2f})"
    return f"| {name} | {check} | {unchecked:.0f} | {checked:.0f} |"


def table(threads: int) -> None:
    """The check in forwards of the original (median of 5 interleaved pairs, on the check's own
    random input) on every network of the network table (``network_table.networks``: seed 0,
    its heads kept as the table keeps them), and the median over them."""
    from network_table import networks, with_statistics

    from slimming.pruning.repair import probe_like

    torch.set_num_threads(threads)
    ratios = []
    for name, build, shape, keep, _ in networks(224):
        torch.manual_seed(0)
        try:
            model = build().eval()
            sparsity_shaped(model, seed=0)
            with_statistics(model)
            example = torch.zeros(1, *shape)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                result = slimming.prune(model, percent=0.3, importance="bn-mean", example_inputs=example,
                                        compensate=False, ignore=(keep or ((), ()))[0], verify=False)
                probe, pairs = probe_like(example), []
                with torch.no_grad():
                    for _ in range(5):
                        t0 = time.perf_counter()
                        model(*probe)
                        t1 = time.perf_counter()
                        verify.check(model, result, example)
                        pairs.append((time.perf_counter() - t1) / (t1 - t0))
        except Exception as e:  # refused, or not built here: say so, go on
            print(f"| {name} | - ({type(e).__name__}) |", flush=True)
            continue
        ratios.append(statistics.median(pairs))
        print(f"| {name} | {ratios[-1]:.2f} |", flush=True)
    print(f"\nmedian over {len(ratios)} networks: {statistics.median(ratios):.2f} forwards")


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--nets", nargs="+", default=list(NETS), choices=NETS)
    p.add_argument("--threads", type=positive_int, default=2)
    p.add_argument("--table", action="store_true", help="the check alone, on every network of the table")
    args = p.parse_args()
    if args.table:
        return table(args.threads)
    torch.set_num_threads(args.threads)
    print("| network | check (forwards, IQR) | prune ms, verify=False | prune ms, checked |")
    print("|---|---|---|---|")
    for name in args.nets:
        print(one(name), flush=True)


if __name__ == "__main__":
    main()
