"""Latency-aimed cuts against FLOPs-aimed cuts on real networks: speed-up over FLOPs ratio,
achieved over asked latency, prune time with the lookup table's cost (cold and warm), and
(``--runtimes``) whether the speed-up holds in channels-last, torch.export and onnxruntime.

For each network, thread count and batch: the gammas are shaped as sparsity training leaves
them (half near zero, seeded), then
- ``target_latency=L``: its own record (asked, achieved, spread, rounds), then an independent
  interleaved measurement of original and pruned (``--repeats`` pairs: the median of the pairs'
  ratios and its 95% bootstrap spread, ``slimming.measure.timing``);
- ``target_flops=F``, F the FLOPs fraction the latency cut kept (the same FLOPs), measured the
  same way: at the same FLOPs, which cut runs faster;
- with ``torch_pruning`` installed (not a dependency), its magnitude pruner at the same FLOPs
  with ``round_to=8``.
The table's cache goes to a temporary folder, so "cold" is a first run on this machine.

    python benchmarks/latency.py --nets resnet50 mobilenet_v2 --threads 1 2 --batches 1
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
from common import guarded, parser, positive_int, record_rows, sparsity_shaped
from torch import nn

import slimming
from slimming.measure import timing
from slimming.measure.latency import time_interleaved
from slimming.measure.stats import count_flops

NETS = ("resnet50", "mobilenet_v2", "efficientnet_b0", "convnext_atto", "yolo")


def build(name: str) -> tuple[nn.Module, dict]:
    """The network (random weights, eval) and the prune keywords it needs."""
    if name == "yolo":
        from detector import TinyYOLO

        return TinyYOLO(attention=True).eval(), {"ignore": "head"}
    if name == "convnext_atto":
        import timm

        model = timm.create_model("convnext_atto", num_classes=1000).eval()
        x = torch.randn(1, 3, 64, 64)
        slimming.add_gates(model, x)
        return model, {"ignore": ("head",)}
    import torchvision

    model = getattr(torchvision.models, name)(weights=None).eval()
    return model, {"ignore": ("fc",) if name == "resnet50" else ("classifier",)}


def interleaved(a: nn.Module, b: nn.Module, x: torch.Tensor, repeats: int) -> dict:
    """Pairs of forwards, a then b: each's ms (low quantile) and the ratio b/a with its spread
    (``slimming.measure.timing``: the median of the pairs' ratios, a 95% bootstrap half-width)."""
    ta, tb = time_interleaved([a, b], (x,), repeats)
    r = timing.ratio(ta, tb)
    return {"a_ms": timing.estimate(ta).value, "b_ms": timing.estimate(tb).value, "ratio": r.value,
            "spread": r.spread}


def torch_pruning_at(model: nn.Module, x: torch.Tensor, flops: float, ignore) -> nn.Module | None:
    """Torch-Pruning's magnitude pruner, its ratio searched to ``flops`` (FLOPs of one image),
    round_to=8; None when the package is not installed."""
    try:
        import torch_pruning as tp
    except ImportError:
        return None
    import copy

    names = (ignore,) if isinstance(ignore, str) else tuple(ignore or ())
    lo, hi, best = 0.0, 0.95, None
    for _ in range(12):
        ratio = (lo + hi) / 2
        m = copy.deepcopy(model)
        skip = [mod for n, mod in m.named_modules() if any(n == i or n.startswith(i + ".") for i in names)]
        pruner = tp.pruner.MagnitudePruner(m, x[:1], importance=tp.importance.MagnitudeImportance(p=1),
                                           pruning_ratio=ratio, ignored_layers=skip, round_to=8,
                                           global_pruning=True)
        pruner.step()
        got = count_flops(m, tuple(x.shape[1:]))
        if got <= flops:
            best, hi = m, ratio
        else:
            lo = ratio
    return best


class Exported(nn.Module):
    """A torch.export program as a module the timer takes (its own eval() is not allowed)."""

    def __init__(self, program):
        super().__init__()
        self.anchor = nn.Parameter(torch.zeros(1))  # the device, for the timer
        object.__setattr__(self, "program", program)  # not a submodule: eval() stays off it

    def forward(self, x):
        return self.program(x)


def runtimes(original: nn.Module, pruned: nn.Module, x: torch.Tensor, repeats: int, threads: int) -> dict:
    """The pruned/original ratio in eager, channels-last, torch.export and onnxruntime."""
    out = {"eager": interleaved(original, pruned, x, repeats)["ratio"]}
    cl = torch.channels_last
    last = [m.to(memory_format=cl) for m in (original, pruned)]
    out["channels_last"] = interleaved(*last, x.contiguous(memory_format=cl), repeats)["ratio"]
    for m in (original, pruned):
        m.to(memory_format=torch.contiguous_format)
    try:
        exported = [Exported(torch.export.export(m, (x,)).module()) for m in (original, pruned)]
        out["torch_export"] = interleaved(*exported, x, repeats)["ratio"]
    except Exception as e:  # noqa: BLE001 (a network torch.export does not take: said)
        out["torch_export"] = f"failed: {str(e).splitlines()[0][:80]}"
    try:
        import onnxruntime as ort

        sessions = []
        with tempfile.TemporaryDirectory() as tmp:
            for i, m in enumerate((original, pruned)):
                path = Path(tmp) / f"{i}.onnx"
                torch.onnx.export(m, (x,), path, dynamo=True, verbose=False)
                opts = ort.SessionOptions()
                opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
                sessions.append(ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"]))
        feed = x.numpy()
        names = [s.get_inputs()[0].name for s in sessions]
        times = [[], []]
        for s, n in zip(sessions, names):
            s.run(None, {n: feed})
        for _ in range(repeats):
            for i, (s, n) in enumerate(zip(sessions, names)):
                start = time.perf_counter()
                s.run(None, {n: feed})
                times[i].append(time.perf_counter() - start)
        out["onnxruntime"] = timing.ratio(*times).value
    except Exception as e:  # noqa: BLE001 (not installed, or an export that fails: said)
        out["onnxruntime"] = f"failed: {str(e).splitlines()[0][:80]}"
    return out


def one(name: str, threads: int, batch: int, args) -> dict:
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model, keywords = build(name)
    sparsity_shaped(model, small=0.5, seed=args.seed)
    model.to(args.device)
    size = (3, args.size, args.size)
    x = torch.randn(batch, *size, device=args.device)
    flops0 = count_flops(model, size)
    row = {"net": name, "threads": threads, "batch": batch, "size": args.size, "asked": args.target}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for cache in ("cold", "warm"):
            start = time.perf_counter()
            lat = slimming.prune(model, target_latency=args.target, example_inputs=x, compensate=False,
                                 **keywords)
            row[f"prune_s_{cache}"] = time.perf_counter() - start
        b = lat.budget
        row["record"] = {"fraction": b.ratio, "fraction_spread": b.ratio_spread, "ms": b.ms,
                         "original_ms": b.original_ms, "met": b.met}
        row["rounds"] = len(b.rounds)
        row["rounds_detail"] = b.as_dict()["rounds"]
        row["table"] = {k: b.table[k] for k in ("entries", "measured", "seconds", "size")}
        flops_lat = count_flops(lat.model, size)
        row["latency_cut"] = {"flops_ratio": flops0 / flops_lat,
                              **interleaved(model, lat.model, x, args.repeats)}
        keep = flops_lat / flops0
        fl = slimming.prune(model, target_flops=keep, example_inputs=x[:1], compensate=False, **keywords)
        row["flops_cut"] = {"flops_ratio": flops0 / count_flops(fl.model, size),
                            **interleaved(model, fl.model, x, args.repeats)}
        try:
            theirs = None if args.no_peer else torch_pruning_at(model, x, flops_lat, keywords.get("ignore"))
        except Exception as e:  # noqa: BLE001 (the peer fails on this network: said, not fatal)
            theirs, row["torch_pruning_round8"] = None, f"failed: {str(e).splitlines()[0][:80]}"
        if theirs is not None:
            row["torch_pruning_round8"] = {"flops_ratio": flops0 / count_flops(theirs, size),
                                           **interleaved(model, theirs, x, args.repeats)}
        if args.runtimes and args.device == "cpu":  # onnxruntime's CPU provider: a CPU comparison
            row["runtimes"] = runtimes(model, lat.model, x, args.repeats, threads)
    for key in ("latency_cut", "flops_cut", "torch_pruning_round8"):
        if isinstance(row.get(key), dict):
            r = row[key]
            r["speedup_over_flops_ratio"] = (1 / r["ratio"]) / r["flops_ratio"]
    return row


def line(row: dict) -> str:
    """One row in a line: the record, the measurement again, each cut's speed-up over FLOPs."""
    def cut(r: dict) -> str:
        return (f"{r['ratio']:.3f}+-{r['spread']:.3f} of the original, FLOPs /{r['flops_ratio']:.2f}, "
                f"speed-up/FLOPs {r['speedup_over_flops_ratio']:.2f}")

    rec = row["record"]
    text = (f"{row['net']:<15} threads {row['threads']} batch {row['batch']:<3} asked {row['asked']}: "
            f"record {rec['fraction']:.3f}+-{rec['fraction_spread']:.3f} in {row['rounds']} round(s) | "
            f"latency cut again {cut(row['latency_cut'])} | target_flops, same FLOPs: "
            f"{cut(row['flops_cut'])}")
    if isinstance(row.get("torch_pruning_round8"), dict):
        text += f" | Torch-Pruning round_to=8: {cut(row['torch_pruning_round8'])}"
    text += (f" | prune {row['prune_s_cold']:.1f} s cold, {row['prune_s_warm']:.1f} s warm (table "
             f"{row['table']['entries']} timings)")
    return text + (f" | runtimes {row['runtimes']}" if "runtimes" in row else "")


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--nets", nargs="+", default=list(NETS), choices=NETS)
    p.add_argument("--threads", nargs="+", type=positive_int, default=[1, 2])
    p.add_argument("--batches", nargs="+", type=positive_int, default=[1])
    p.add_argument("--size", type=positive_int, default=224)
    p.add_argument("--target", type=float, default=0.5, help="target_latency, a fraction")
    p.add_argument("--repeats", type=positive_int, default=21, help="interleaved pairs per figure")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="cpu or cuda (timed with synchronisation)")
    p.add_argument("--runtimes", action="store_true", help="also channels-last, torch.export, onnxruntime")
    p.add_argument("--no-peer", action="store_true", help="skip Torch-Pruning even when installed")
    p.add_argument("--out", type=Path, default=None, help="a JSON file for the rows")
    args = p.parse_args()
    os.environ.setdefault("SLIMMING_CACHE_DIR", tempfile.mkdtemp(prefix="slimming-latency-"))
    record_rows((one(name, threads, batch, args) for name in args.nets for threads in args.threads
                 for batch in args.batches), line, args.out)


if __name__ == "__main__":
    sys.exit(guarded(main))
