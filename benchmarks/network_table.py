"""slimming and Torch-Pruning on many networks nobody here wrote (torchvision and timm
classifiers, segmentation models) and our own YOLO-style detector, at one rule: one global
ranking of BatchNorm |gamma| (a group's channels scored by the mean over its BatchNorms), 30% of
the channels removed, the outputs (classifier, segmentation logits, detection head) kept.

For each network, on random sparsity-shaped gammas: the parameters each tool cut; whether each
pruned network runs and is exact (its outputs equal the original's with the cut channels'
gamma and beta zeroed, max relative difference under 1e-4); and the in-process prune time of
each (median of interleaved runs in one process, Torch-Pruning's including the copy it needs to
leave the model intact; the garbage of each run collected before the next, so that neither pays
for the other's). Torch-Pruning is installed for this benchmark only
(``pip install torch-pruning``); it is never a dependency of slimming.

    python benchmarks/network_table.py [--size 224] [--repeats 3] [--only resnet50,...]
        [--out runs/network_table.json]
"""

from __future__ import annotations

import copy
import gc
import json
import signal
import statistics
import time
import warnings
from pathlib import Path

import torch
from common import guarded, parser, positive_int, sparsity_shaped
from torch import nn

import slimming

PERCENT = 0.3
LIMIT = 60  # seconds Torch-Pruning may take on one network before it counts as not finishing

# (name, builder, input size, the modules kept: () or (for slimming's ignore=, for Torch-Pruning's
# ignored_layers); classifiers: nothing for slimming, the last Linear for Torch-Pruning)
TORCHVISION = ["resnet18", "resnet50", "resnext50_32x4d", "wide_resnet50_2", "mobilenet_v2",
               "mobilenet_v3_large", "mobilenet_v3_small", "efficientnet_b0", "efficientnet_v2_s",
               "densenet121", "regnet_x_400mf", "regnet_y_400mf", "mnasnet1_0", "vgg11_bn",
               "googlenet", "shufflenet_v2_x1_0"]
TIMM = ["cspdarknet53", "cspresnet50", "res2net50_26w_4s", "ghostnet_100", "rexnet_100", "dla34",
        "dpn68", "hrnet_w18_small", "mixnet_s", "ese_vovnet19b_dw", "repvgg_a0", "selecsls42b",
        "convnext_atto"]
SEGMENTATION = ["lraspp_mobilenet_v3_large", "deeplabv3_mobilenet_v3_large", "fcn_resnet50"]


def networks(size: int) -> list[tuple[str, object, int, tuple[str, ...]]]:
    import timm
    import torchvision
    from detector import SIZE, TinyYOLO

    out = [(f"torchvision {n}", lambda n=n: torchvision.models.get_model(
        n, weights=None, num_classes=10, **({"aux_logits": False, "init_weights": True}
                                           if n == "googlenet" else {})), size, ()) for n in TORCHVISION]
    out += [(f"timm {n}", lambda n=n: timm.create_model(n, pretrained=False, num_classes=10), size, ())
            for n in TIMM]
    # slimming keeps a model's outputs by itself; Torch-Pruning is told the layers that make them
    heads = {"lraspp_mobilenet_v3_large": ("classifier.low_classifier", "classifier.high_classifier")}
    out += [(f"torchvision {n}", lambda n=n: getattr(torchvision.models.segmentation, n)(
        weights=None, weights_backbone=None, num_classes=5), size, ((), heads.get(n, ("classifier.4",))))
        for n in SEGMENTATION]
    out += [("own YOLO-style detector (benchmarks/detector.py)", TinyYOLO, SIZE, (("head",), ("head",))),
            ("slimming vgg19 (traced)", lambda: slimming.models.build("vgg", depth=19), 32, ())]
    return out


def with_statistics(model: nn.Module, seed: int = 1) -> None:
    """Random betas and running statistics in every BatchNorm, so that a cut channel's
    constant output (what exactness is about) is not zero."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                n = m.num_features
                m.bias.copy_(torch.randn(n, generator=g) * 0.3)
                m.running_mean.copy_(torch.randn(n, generator=g) * 0.2)
                m.running_var.copy_(torch.rand(n, generator=g) + 0.5)


def output_of(y) -> torch.Tensor:
    if isinstance(y, dict):
        y = y["out"]
    if isinstance(y, (list, tuple)):
        return torch.cat([output_of(v).flatten() for v in y])
    return y.flatten().float()


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()


def zeroed(model: nn.Module, masks: dict[str, torch.Tensor]) -> nn.Module:
    z = copy.deepcopy(model)
    with torch.no_grad():
        for name, keep in masks.items():
            bn = z.get_submodule(name)
            bn.weight[~keep] = 0
            bn.bias[~keep] = 0
    return z


def masks_by_value(original: nn.Module, pruned: nn.Module) -> dict[str, torch.Tensor]:
    """Which channels each BatchNorm kept, found by its surviving gammas (all distinct)."""
    masks = {}
    pruned_modules = dict(pruned.named_modules())
    for name, bn in original.named_modules():
        if isinstance(bn, nn.BatchNorm2d) and name in pruned_modules:
            kept = pruned_modules[name].weight.detach()
            masks[name] = torch.isin(bn.weight.detach(), kept)
    return masks


def params(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def timed(fns, repeats: int) -> list[float]:
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            try:
                fn()
            except Exception:  # a tool that fails has no time
                times[i].append(float("nan"))
                continue
            times[i].append(time.perf_counter() - start)
            gc.collect()  # each tool's garbage is collected outside the other's timing
    return [statistics.median(t) for t in times]


def one(name: str, build, size: int, keep: tuple, repeats: int, tp) -> dict:
    torch.manual_seed(0)
    model = build().eval()
    sparsity_shaped(model, seed=0)
    with_statistics(model)
    example = torch.zeros(1, 3, size, size)
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(x)
    row = {"network": name, "size": size, "params": params(model)}

    ours_keep, tp_keep = keep or ((), ())

    def ours():
        return slimming.prune(model, percent=PERCENT, importance="bn-mean", example_inputs=example,
                              compensate=False, ignore=ours_keep)

    def theirs():
        m = copy.deepcopy(model)
        linears = [x for x in m.modules() if isinstance(x, nn.Linear)]
        ignored = [m.get_submodule(k) for k in tp_keep] or linears[-1:]
        pruner = tp.pruner.BNScalePruner(
            m, example, importance=tp.importance.BNScaleImportance(group_reduction="mean", normalizer=None),
            global_pruning=True, pruning_ratio=PERCENT, ignored_layers=ignored)
        pruner.step()
        return m

    try:
        result = ours()
        with torch.no_grad():
            diff = rel_diff(output_of(result.model(x)), output_of(zeroed(model, result.masks)(x)))
        row.update(ours_cut=1 - params(result.model) / row["params"], ours_exact=diff < 1e-4, ours_diff=diff)
    except slimming.SlimmingError as e:
        row.update(ours_error=str(e)[:160])
    def alarm(signum, frame):
        raise TimeoutError(f"did not finish in {LIMIT} s")

    try:
        signal.signal(signal.SIGALRM, alarm)
        signal.alarm(LIMIT)  # Torch-Pruning never returns on some networks (rexnet_100)
        try:
            small = theirs()
        finally:
            signal.alarm(0)
        row["tp_cut"] = 1 - params(small) / row["params"]
        try:
            with torch.no_grad():
                out = output_of(small(x))
                diff = rel_diff(out, output_of(zeroed(model, masks_by_value(model, small))(x)))
            row.update(tp_runs=True, tp_exact=diff < 1e-4, tp_diff=diff)
        except Exception as e:
            row.update(tp_runs=False, tp_error=f"{type(e).__name__}: {str(e)[:120]}")
    except Exception as e:
        row.update(tp_error=f"{type(e).__name__} while pruning: {str(e)[:120]}")
    del full
    if "ours_error" not in row:
        fns = [lambda: ours().model] + ([theirs] if "tp_cut" in row else [])
        t = timed(fns, repeats)
        row["ours_ms"] = 1000 * t[0]
        if len(t) > 1:
            row["tp_ms"] = 1000 * t[1]
    return row


def cell(row: dict, who: str) -> str:
    if f"{who}_cut" not in row:
        why = row.get(f"{who}_error", "?")
        if who == "ours":  # slimming's refusals are one line: say what it named
            for known in ("channel shuffle", "no BatchNorm", "cannot follow"):
                if known in why:
                    return f"refused: {known}" + (f" ({why.split(' through ')[1].split(' (')[0]})"
                                                  if known == "cannot follow" else "")
        return ("did not finish in 60 s" if "did not finish" in why else "error: " + why.split(":")[0])
    ran = row.get(f"{who}_runs", True)
    exact = "exact" if row.get(f"{who}_exact") else ("does not run" if not ran else
                                                        f"not exact ({row[f'{who}_diff']:.1e})")
    return f"{row[f'{who}_cut']:.1%}, {exact}"


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--size", type=positive_int, default=224)
    ap.add_argument("--repeats", type=positive_int, default=3)
    ap.add_argument("--only", default="", help="comma-separated parts of network names")
    ap.add_argument("--out", type=Path, default=Path("runs/network_table.json"))
    args = ap.parse_args()
    try:
        import torch_pruning as tp  # the peer measured here; not a dependency of slimming
    except ImportError:
        ap.error("this comparison needs Torch-Pruning: pip install torch-pruning")
    torch.set_num_threads(2)
    warnings.simplefilter("ignore")
    rows = []
    print("| network | parameters | slimming: cut, result | Torch-Pruning: cut, result | "
          "slimming ms | Torch-Pruning ms | ratio |")
    print("|---|---|---|---|---|---|---|")
    for name, build, size, keep in networks(args.size):
        if args.only and not any(part in name for part in args.only.split(",")):
            continue
        row = one(name, build, size, keep, args.repeats, tp)
        rows.append(row)
        ratio = f"{row['ours_ms'] / row['tp_ms']:.2f}" if "tp_ms" in row and "ours_ms" in row else "-"
        print(f"| {name} @{size} | {row['params'] / 1e6:.2f}M | {cell(row, 'ours')} | {cell(row, 'tp')} | "
              f"{row.get('ours_ms', float('nan')):.0f} | {row.get('tp_ms', float('nan')):.0f} | {ratio} |",
              flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    raise SystemExit(guarded(main))
