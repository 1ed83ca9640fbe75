"""The same cuts, row by row: what ``slimming.prune`` gives on every network of the network table
(``network_table.networks``: random weights, sparsity-shaped gammas, seed 0; 30% of the
channels by ``bn-mean``, no compensation, the heads kept as the table keeps them), checked and
with ``verify=False``: the parameters left, a fingerprint of every tensor's shape, whether the
check passed, how many cuts were made again, or the one-line refusal. For a refactor: run it
under the tree before and the tree after (the older one's ``slimming/`` first on PYTHONPATH),
then compare the two files; no Torch-Pruning needed, one thread, about ten minutes here.

    python benchmarks/same_cuts.py --out before.json [--only resnet50,...] [--size 224]
    python benchmarks/same_cuts.py --compare before.json after.json
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
import warnings
from pathlib import Path

import torch
from common import guarded, parser, positive_int, sparsity_shaped

import slimming

PERCENT = 0.3


def row(build, shape: tuple, keep: tuple) -> dict:
    torch.manual_seed(0)
    model = build().eval()
    sparsity_shaped(model, seed=0)
    from network_table import with_statistics
    with_statistics(model)
    example = torch.zeros(1, *shape)
    out = {}
    for verify in (True, False):
        start = time.perf_counter()
        key = "checked" if verify else "unchecked"
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                r = slimming.prune(model, percent=PERCENT, importance="bn-mean", example_inputs=example,
                                   compensate=False, ignore=(keep or ((), ()))[0], verify=verify)
            shapes = sorted((k, tuple(v.shape)) for k, v in r.model.state_dict().items())
            out[key] = {"params": sum(p.numel() for p in r.model.parameters()),
                        "shapes": hashlib.md5(repr(shapes).encode()).hexdigest()[:10],
                        "passed": None if r.verified is None else float(r.verified) < 1e-4,
                        "retries": len(r.retries)}
        except slimming.SlimmingError as e:
            out[key] = {"refused": str(e)[:120]}
        out[f"{key}_s"] = round(time.perf_counter() - start, 2)
    return out


def compare(before: Path, after: Path) -> None:
    try:
        a, b = (json.loads(p.read_text()) for p in (before, after))
    except (OSError, ValueError) as e:
        raise slimming.SlimmingError(f"--compare takes two files this script wrote: {e}") from None
    changed = 0
    for name in sorted(set(a) | set(b)):
        for key in ("checked", "unchecked"):
            if a.get(name, {}).get(key) != b.get(name, {}).get(key):
                changed += 1
                print(f"{name} ({key}): {a.get(name, {}).get(key)} -> {b.get(name, {}).get(key)}")
    print(f"{len(a)} and {len(b)} networks; {changed} cut(s) differ")


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    ap.add_argument("--only", default="", help="comma-separated parts of network names")
    ap.add_argument("--size", type=positive_int, default=224)
    args = ap.parse_args()
    if args.compare:
        return compare(*args.compare)
    if args.out is None:
        ap.error("give --out FILE (or --compare BEFORE AFTER)")
    if args.out.is_dir() or not args.out.parent.is_dir():
        ap.error(f"--out {args.out}: not a file in a folder that exists")
    from network_table import networks
    torch.set_num_threads(1)
    rows = {}
    for name, build, shape, keep, _ in networks(args.size):
        if args.only and not any(part in name for part in args.only.split(",")):
            continue
        try:
            rows[name] = row(build, shape, keep)
        except Exception as e:  # a network this torch/timm cannot build or run: say so, go on
            rows[name] = {"not built": f"{type(e).__name__}: {str(e)[:100]}"}
        print(name, rows[name], flush=True)
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    sys.exit(guarded(main))
