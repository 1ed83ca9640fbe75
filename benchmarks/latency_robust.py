"""A latency budget on a quiet and on a busy machine (issue 43): asked against achieved, re-timed
by a separate process in eager and in onnxruntime; prune time cold and warm, in forwards of the
original; and at equal FLOPs, how fast the latency cut is against a FLOPs cut and against
Torch-Pruning's ``round_to=8`` cut.

For each network, thread count and load (``--load N``: N CPU-bound Python loops running beside
everything the row measures, as a user's other work would), the gammas shaped as sparsity
training leaves them (half near zero, seeded), then:
- ``target_latency=T`` twice, the table cold (a fresh cache folder) then warm: its record
  (ratio +- spread, rounds, samples), the seconds it took and that in forwards of the original
  (one forward: the fastest of 7 before the row, under the same load);
- ``target_latency=T, round_to=1`` (the widths before 8 became the default under a budget);
- ``target_latency=T`` aimed at onnxruntime (``MeasuredLatency(runtime="onnxruntime")``);
- ``target_flops=F`` at the FLOPs the latency cut kept (round_to 1 and 8), and with
  ``torch_pruning`` installed (a benchmark's extra, not a dependency) its magnitude pruner at
  the same FLOPs with ``round_to=8``;
- every cut saved (``slimming.save_pruned``) and re-timed against the original by a fresh
  process (``--retime``), under the same load: ``--repeats`` interleaved pairs in eager and in
  onnxruntime, the median of the pairs' ratios and its 95% bootstrap spread.

    python benchmarks/latency_robust.py --nets resnet34 mobilenet_v3_large --threads 1 --load 0 2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
from common import guarded, parser, positive_int, record_rows, sparsity_shaped
from latency import torch_pruning_at
from torch import nn

import slimming
from slimming.measure import timing
from slimming.measure.latency import MeasuredLatency, time_calls
from slimming.measure.runtimes import prepared
from slimming.measure.stats import count_flops

NETS = ("resnet34", "regnet_y_800mf", "densenet121", "mobilenet_v3_large", "resnet50", "mobilenet_v2",
        "shufflenet_v2_x1_0")


def build(name: str) -> nn.Module:
    import torchvision

    return getattr(torchvision.models, name)(weights=None).eval()


def ignore_of(name: str) -> tuple[str, ...]:
    return ("fc",) if name.startswith(("resnet", "regnet", "shufflenet")) else ("classifier",)


@contextlib.contextmanager
def load(n: int):
    """``n`` CPU-bound Python loops beside the block, stopped after it."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        time.sleep(1.0 if n else 0)
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def one_forward(model: nn.Module, x: torch.Tensor) -> float:
    run = prepared(model, (x,))
    for _ in range(2):
        run()
    return min(time_calls([run], 7, 0)[0])


def record(b) -> dict:
    return {"ratio": b.ratio, "spread": b.ratio_spread, "met": b.met, "rounds": len(b.rounds),
            "samples": [r.samples for r in b.rounds], "ms": b.ms, "original_ms": b.original_ms,
            "runtime": b.runtime, "table_new": b.table.get("measured"), "table_s": b.table.get("seconds"),
            "table_noisy": b.table.get("noisy")}


def retime(folder: Path, name: str, threads: int, repeats: int) -> dict:
    """In this (fresh) process: each cut saved in ``folder`` against a freshly built original,
    interleaved pairs in eager and in onnxruntime."""
    torch.set_num_threads(threads)
    original = build(name)  # the very weights the cuts came from (tiny gammas: tiny activations)
    original.load_state_dict(torch.load(folder / "original.pt", weights_only=True))
    x = torch.randn(1, 3, 224, 224)
    out = {}
    for path in sorted(folder.glob("*.pth")):
        pruned = slimming.load_pruned(path, build(name)).eval()
        row = {}
        for runtime in ("eager", "onnxruntime"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                runs = [prepared(original, (x,), runtime), prepared(pruned, (x,), runtime)]
            a, b = time_calls(runs, repeats, 2)
            r = timing.ratio(a, b)
            row[runtime] = [r.value, r.spread]
        out[path.stem] = row
    return out


def one(name: str, threads: int, n_load: int, args) -> dict:
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = build(name)
    sparsity_shaped(model, small=0.5, seed=args.seed)
    ignore = ignore_of(name)
    x = torch.randn(1, 3, 224, 224)
    size = (3, 224, 224)
    flops0 = count_flops(model, size)
    row = {"net": name, "threads": threads, "load": n_load, "asked": args.target,
           "machine_load": timing.machine_load()}
    cuts: dict[str, nn.Module] = {}
    with load(n_load), tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        os.environ["SLIMMING_CACHE_DIR"] = str(Path(tmp) / "cache")
        row["forward_ms"] = one_forward(model, x)
        for cache in ("cold", "warm"):
            start = time.perf_counter()
            try:
                r = slimming.prune(model, target_latency=args.target, example_inputs=x, ignore=ignore,
                                   compensate=False)
            except slimming.SlimmingError as e:
                row[f"latency_{cache}"] = f"refused: {e}"
                continue
            s = time.perf_counter() - start
            row[f"latency_{cache}"] = {**record(r.budget), "seconds": s,
                                       "forwards": 1000 * s / row["forward_ms"]}
            cuts["latency"] = r.model
        if "latency" not in cuts:
            return row
        flops_lat = count_flops(cuts["latency"], size)
        row["flops_kept"] = flops_lat / flops0
        try:
            r = slimming.prune(model, target_latency=args.target, example_inputs=x, ignore=ignore,
                               compensate=False, round_to=1)
            row["latency_round1"] = record(r.budget)
            cuts["latency_round1"] = r.model
        except slimming.SlimmingError as e:
            row["latency_round1"] = f"refused: {e}"
        start = time.perf_counter()
        try:
            r = slimming.prune(model, target_latency=args.target, example_inputs=x, ignore=ignore,
                               compensate=False, latency_model=MeasuredLatency(runtime="onnxruntime"))
            row["latency_onnxruntime"] = {**record(r.budget), "seconds": time.perf_counter() - start}
            cuts["latency_onnxruntime"] = r.model
        except slimming.SlimmingError as e:
            row["latency_onnxruntime"] = f"refused: {e}"
        for k in (1, 8):
            r = slimming.prune(model, target_flops=flops_lat / flops0, example_inputs=x, ignore=ignore,
                               compensate=False, round_to=k)
            cuts[f"flops_round{k}"] = r.model
        try:
            theirs = None if args.no_peer else torch_pruning_at(model, x, flops_lat, ignore)
        except Exception as e:  # noqa: BLE001 (the peer fails on this network: said, not fatal)
            theirs, row["torch_pruning_round8"] = None, f"failed: {str(e).splitlines()[0][:80]}"
        if theirs is not None:
            cuts["torch_pruning_round8"] = theirs
        row["flops"] = {k: count_flops(m, size) / flops0 for k, m in cuts.items()}
        folder = Path(tmp) / "cuts"
        folder.mkdir()
        for k, m in cuts.items():  # the peer's too: save_pruned keeps any network's widths
            slimming.save_pruned(m, folder / f"{k}.pth")
        torch.save(model.state_dict(), folder / "original.pt")
        out = subprocess.run([sys.executable, __file__, "--retime", str(folder), "--nets", name,
                              "--threads", str(threads), "--repeats", str(args.repeats)],
                             capture_output=True, text=True, check=True)
        row["retimed"] = json.loads(out.stdout.strip().splitlines()[-1])
    return row


def line(row: dict) -> str:
    parts = [f"{row['net']:<18} threads {row['threads']} load {row['load']} ({row['machine_load']}), "
             f"one forward {row['forward_ms']:.1f} ms"]
    for key in ("latency_cold", "latency_warm", "latency_round1", "latency_onnxruntime"):
        r = row.get(key)
        if isinstance(r, dict):
            took = f", {r['seconds']:.1f} s" if "seconds" in r else ""
            took += f" = {r['forwards']:.0f} forwards" if "forwards" in r else ""
            parts.append(f"{key}: {r['ratio']:.3f} +- {r['spread']:.3f} (met {r['met']}, {r['rounds']} "
                         f"rounds {r['samples']}{took})")
        elif r is not None:
            parts.append(f"{key}: {r}")
    for k, v in row.get("retimed", {}).items():
        (e, es), (o, os_) = v["eager"], v["onnxruntime"]
        parts.append(f"re-timed {k} (FLOPs {row['flops'][k]:.3f}): eager {e:.3f} +- {es:.3f}, "
                     f"onnxruntime {o:.3f} +- {os_:.3f}")
    return "\n  ".join(parts)


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--nets", nargs="+", default=list(NETS[:4]), choices=NETS)
    p.add_argument("--threads", nargs="+", type=positive_int, default=[1])
    p.add_argument("--load", nargs="+", type=int, default=[0, 2], help="CPU-bound loops beside each row")
    p.add_argument("--target", type=float, default=0.5, help="target_latency, a fraction")
    p.add_argument("--repeats", type=positive_int, default=21, help="interleaved pairs when re-timed")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-peer", action="store_true", help="skip Torch-Pruning even when installed")
    p.add_argument("--retime", type=Path, default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, default=None, help="a JSON file for the rows")
    args = p.parse_args()
    if args.retime is not None:
        print(json.dumps(retime(args.retime, args.nets[0], args.threads[0], args.repeats)))
        return
    record_rows((one(name, threads, n, args) for name in args.nets for threads in args.threads
                 for n in args.load), line, args.out)


if __name__ == "__main__":
    sys.exit(guarded(main))
