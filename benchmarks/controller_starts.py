"""Does ``--sparsity-target F`` reach F from any starting strength? (issue 16)

Trains the quarter-width VGG-11 on the CIFAR-10 JPEG copy for a short run once per starting
strength, with ``--sparsity S --sparsity-target F``, and prints the strength and the fraction of
|gamma| under 1e-2 after every epoch (from each run's metrics.jsonl) and a JSON summary.

    python benchmarks/controller_starts.py --data-root ../shared/data/cifar10-jpeg \\
        --out runs/controller --starts 1e-5,1e-4,1e-3,1e-2 --epochs 5 --target 0.5
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
    ap.add_argument("--epochs", type=positive_int, default=5)
    ap.add_argument("--target", type=float, default=0.5)
    ap.add_argument("--batch-size", type=positive_int, default=128)
    args = ap.parse_args()
    try:
        starts = [float(s) for s in args.starts.split(",")]
    except ValueError:
        ap.error(f"--starts {args.starts!r}: comma-separated numbers, like 1e-5,1e-2")
    summary = {}
    for start in starts:
        save = args.out / f"start{start:g}"
        run("train", "--arch", "vgg", "--cfg", QUARTER_VGG11, "--dataset", "imagefolder",
            "--data-root", args.data_root, "--epochs", args.epochs, "--batch-size", args.batch_size,
            "--sparsity", start, "--sparsity-target", args.target, "--seed", "0", "--cpu",
            "--save", save)
        rows = [json.loads(line) for line in (save / "metrics.jsonl").read_text().splitlines()]
        summary[f"{start:g}"] = [{"epoch": r["epoch"], "strength_start": r["sparsity"],
                                  "strength_end": r.get("sparsity_end"),
                                  "fraction": round(r["gamma_lt_1e-2"], 4), "test_acc": r["test_acc"]}
                                 for r in rows]
        for r in summary[f"{start:g}"]:
            print(f"start {start:g}  epoch {r['epoch']}  strength {r['strength_start']:.3g} -> "
                  f"{r['strength_end']:.3g}  |gamma|<1e-2 {100 * r['fraction']:.1f}%  "
                  f"test acc {r['test_acc']:.2f}%", flush=True)
    print(json.dumps({"target": args.target, "epochs": args.epochs, "runs": summary}, indent=1))


if __name__ == "__main__":
    sys.exit(guarded(main))
