"""What the default prune pays for its check, per network: the check (``verify.check``) in
forwards of the original at the example's size (median of 15 interleaved pairs, with the
interquartile range), and the whole ``prune`` call with and without the check (median of 5
interleaved pairs). Random weights, sparsity-shaped gammas (seed 0), 224x224, batch 1, 30% of
the channels by ``bn-mean``, no compensation (as the network table prunes).

To compare two checkouts side by side, run it under each in turn (fresh processes, alternating,
so that both see the same machine), e.g. with the older tree's ``slimming/`` on PYTHONPATH:

    python benchmarks/check_cost.py [--nets resnet18 mobilenet_v2 ...] [--threads 2]
    python benchmarks/check_cost.py --table --threads 1    # every network of the network table
    python benchmarks/check_cost.py --parts [--nets ...]     # what the check and the prune are made of

``--parts``: per network, in milliseconds (medians of 9 interleaved runs): a forward of the
original and one of the pruned network (the check's floor: it runs both), the same two with
every module's output fingerprinted (``verify.fingerprints``), the whole check, and the
unchecked prune's trace and cut (``trace.trace``; ``surgery.cut`` with the rest of the plan's
build), beside Torch-Pruning's ``BNScalePruner`` on a copy (the network table's route; needs
``pip install torch-pruning``). What the check costs over its floor, and what no check of two
forwards can go under, in numbers.
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
    "vit_tiny": ("timm", "vit_tiny_patch16_224"), "mobilenet_v3_small": ("torchvision", "mobilenet_v3_small"),
    "mnasnet0_5": ("torchvision", "mnasnet0_5"), "lcnet_050": ("timm", "lcnet_050"),
}


def build(name: str):
    library, arch = NETS[name]
    if library == "timm":
        import timm
        return timm.create_model(arch, pretrained=False, num_classes=10)
    import torchvision
    return torchvision.models.get_model(arch, weights=None, num_classes=10)


def prepared(name: str):
    """The network (seed 0, sparsity-shaped), its zero example and the prune's options."""
    torch.manual_seed(0)
    model = build(name).eval()
    sparsity_shaped(model, seed=0)
    x = torch.zeros(1, 3, 224, 224)
    return model, x, dict(percent=0.3, example_inputs=x, compensate=False, importance="bn-mean")


def one(name: str) -> str:
    model, x, options = prepared(name)
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


def parts(name: str) -> str:
    import copy

    import torch_pruning as tp

    from slimming.pruning import plans as plan_module
    from slimming.pruning import prune as prune_module
    from slimming.pruning.repair import probe_like

    model, x, options = prepared(name)
    spent = {"trace": 0.0, "build": 0.0}

    def timing(fn, key):
        def timed(*a, **k):
            start = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[key] += time.perf_counter() - start
        return timed

    def theirs():
        m = copy.deepcopy(model)
        last = [q for q in m.modules() if isinstance(q, torch.nn.Linear)][-1:]
        tp.pruner.BNScalePruner(m, x, importance=tp.importance.BNScaleImportance(group_reduction="mean",
                                                                                  normalizer=None),
                                global_pruning=True, pruning_ratio=0.3, ignored_layers=last).step()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = slimming.prune(model, verify=False, **options)
        kept = {**result.masks, **{n: m["out"] for n, m in result.layers.items() if "out" in m}}
        probe = probe_like(x)

        @torch.no_grad()
        def printed(net, narrow=None, shapes=None):
            with verify.fingerprints(net, narrow, shapes) as found:
                net(*probe)
            return found

        forward = torch.no_grad()(lambda net: net(*probe))
        runs = {"original": lambda: forward(model), "pruned": lambda: forward(result.model),
                "original, fingerprinted": lambda: printed(model, kept, printed(result.model)),
                "pruned, fingerprinted": lambda: printed(result.model),
                "check": lambda: verify.check(model, result, x),
                "unchecked prune": lambda: slimming.prune(model, verify=False, **options),
                "checked prune": lambda: slimming.prune(model, **options), "Torch-Pruning": theirs}
        times = {k: [] for k in runs}
        split = {"trace": [], "build": []}
        saved = plan_module.trace, prune_module._cut  # the trace is the plan's first step
        plan_module.trace, prune_module._cut = timing(saved[0], "trace"), timing(saved[1], "build")
        try:
            for _ in range(9):
                for key, fn in runs.items():
                    spent.update(trace=0.0, build=0.0)
                    start = time.perf_counter()
                    fn()
                    times[key].append(time.perf_counter() - start)
                    if key == "unchecked prune":  # its trace and cut, in the same run
                        for part in split:
                            split[part].append(spent[part])
        finally:
            plan_module.trace, prune_module._cut = saved
    ms = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    ms["original, fingerprinted"] -= ms["pruned, fingerprinted"]  # it ran the pruned one first
    fwd = ms["original"]
    floor = ms["original"] + ms["pruned"]
    trace, cut = (1e3 * statistics.median(split[part]) for part in ("trace", "build"))
    prints = ms["original, fingerprinted"] + ms["pruned, fingerprinted"] - floor
    return (f"| {name} | {fwd:.1f} | {ms['pruned']:.1f} | {floor / fwd:.2f} | {prints / fwd:.2f} | "
            f"{ms['check'] / fwd:.2f} | {trace:.0f} | {cut:.0f} | "
            f"{ms['unchecked prune']:.0f} | {ms['checked prune']:.0f} | {ms['Torch-Pruning']:.0f} | "
            f"{ms['checked prune'] / ms['Torch-Pruning']:.2f} | {floor / ms['Torch-Pruning']:.2f} |")


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
    p.add_argument("--parts", action="store_true", help="what the check and the prune are made of")
    args = p.parse_args()
    if args.table:
        return table(args.threads)
    torch.set_num_threads(args.threads)
    if args.parts:
        print("| network | forward ms | pruned forward ms | both (forwards) | fingerprints (forwards) | "
              "check (forwards) | trace ms | cut ms | unchecked ms | checked ms | Torch-Pruning ms | "
              "checked / TP | both forwards / TP |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for name in args.nets:
            print(parts(name), flush=True)
        return
    print("| network | check (forwards, IQR) | prune ms, verify=False | prune ms, checked |")
    print("|---|---|---|---|")
    for name in args.nets:
        print(one(name), flush=True)


if __name__ == "__main__":
    main()
