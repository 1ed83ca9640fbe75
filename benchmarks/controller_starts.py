"""Does ``--sparsity-target F`` reach F from any starting strength, in runs of any length?
(issues 16 and 24)

Trains the quarter-width VGG-11 on the CIFAR-10 JPEG copy once per run length and starting
strength, with ``--sparsity S --sparsity-target F``, and prints the strength and the fraction of
|gamma| under 1e-2 after every epoch (from each run's metrics.jsonl) and a JSON summary.

    python benchmarks/controller_starts.py --data-root ../shared/data/cifar10-jpeg \\
        --out runs/controller --starts 1e-5,1e-3,1e-2 --epochs 5,6,8,12 --target 0.5
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import guarded, out_folder, parser, positive_int, run  # noqa: E402

QUARTER_VGG11 = "16,M,32,M,64,64,M,128,128,M,128,128"


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--data-root", type=Path, required=True)
    ap.add_argument("--out", type=out_folder, required=True, help="a folder of its own (one run per start)")
    ap.add_argument("--starts", default="1e-5,1e-4,1e-3,1e-2", help="starting strengths, comma-separated")
    ap.add_argument("--epochs", default="5", help="run lengths in epochs, comma-separated")
    ap.add_argument("--target", type=float, default=0.5)
    ap.add_argument("--batch-size", type=positive_int, default=128)
    args = ap.parse_args()
    try:
        starts = [float(s) for s in args.starts.split(",")]
    except ValueError:
        ap.error(f"--starts {args.starts!r}: comma-separated numbers, like 1e-5,1e-2")
    try:
        lengths = [positive_int(e) for e in args.epochs.split(",")]
    except Exception:
        ap.error(f"--epochs {args.epochs!r}: comma-separated positive integers, like 5,6,8,12")
    summary = {}
    for epochs, start in ((e, s) for e in lengths for s in starts):
        key = f"{epochs} epochs from {start:g}"
        save = args.out / f"e{epochs}-start{start:g}"
        run("train", "--arch", "vgg", "--cfg", QUARTER_VGG11, "--dataset", "imagefolder",
            "--data-root", args.data_root, "--epochs", epochs, "--batch-size", args.batch_size,
            "--sparsity", start, "--sparsity-target", args.target, "--seed", "0", "--cpu",
            "--save", save)
        rows = [json.loads(line) for line in (save / "metrics.jsonl").read_text().splitlines()]
        summary[key] = [{"epoch": r["epoch"], "strength_start": r["sparsity"],
                                  "strength_end": r.get("sparsity_end"),
                                  "fraction": round(r["gamma_lt_1e-2"], 4), "test_acc": r["test_acc"]}
                                 for r in rows]
        for r in summary[key]:
            print(f"{epochs} epochs, start {start:g}  epoch {r['epoch']}  "
                  f"strength {r['strength_start']:.3g} -> {r['strength_end']:.3g}  "
                  f"|gamma|<1e-2 {100 * r['fraction']:.1f}%  "
                  f"test acc {r['test_acc']:.2f}%", flush=True)
    print(json.dumps({"target": args.target, "runs": summary}, indent=1))
    for key, rows in summary.items():
        print(f"{key}: ends at {100 * rows[-1]['fraction']:.1f}% (target {100 * args.target:g}%), "
              f"test acc {rows[-1]['test_acc']:.2f}%")


if __name__ == "__main__":
    sys.exit(guarded(main))
