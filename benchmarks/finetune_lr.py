"""Which learning rate a short fine-tune wants (issue 48, item 6): on part of the CIFAR-10 copy,
a small VGG trained with sparsity (``--sparsity 1e-4 --sparsity-target 0.5``), cut
(``--percent``, half of its channels by default), then fine-tuned for 1 and 3 epochs at several
learning rates, each seed its own run, through the commands a user runs (``slimming train``,
``prune``, ``finetune``). For each fine-tune: the accuracy right after the cut, and the
fine-tune's best and last test accuracy.

    python benchmarks/finetune_lr.py --data-root ../shared/data/cifar10-jpeg [--seeds 0,1,2]
        [--limit 500] [--epochs 15] [--percent 0.5] [--lrs 0.1,0.01,0.001] [--finetune-epochs 1,3]
        [--out runs/ft-lr]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

from common import parser

CFG = "32,M,64,M,128,M,128,M,128"


def slimming(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "slimming", *args, "--cpu"], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"slimming {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    return done.stdout


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--data-root", required=True)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--limit", default="500")
    p.add_argument("--epochs", default="15")
    p.add_argument("--lrs", default="0.1,0.01,0.001")
    p.add_argument("--finetune-epochs", default="1,3")
    p.add_argument("--percent", default="0.5", help="the share of channels cut")
    p.add_argument("--out", type=Path, default=Path("runs/ft-lr"))
    args = p.parse_args()
    data = ["--dataset", "imagefolder", "--data-root", args.data_root, "--limit", args.limit]
    results = []
    for seed in args.seeds.split(","):
        run = args.out / f"seed{seed}"
        slimming("train", "--arch", "vgg", "--cfg", CFG, *data, "--epochs", args.epochs, "--sparsity", "1e-4",
                 "--sparsity-target", "0.5", "--seed", seed, "--save", str(run / "sparse"), "--overwrite")
        trained = max(r["test_acc"] for r in rows(run / "sparse" / "metrics.jsonl"))
        slimming("prune", "--checkpoint", str(run / "sparse" / "best.pth"), "--percent", args.percent, *data,
                 "--save", str(run / "pruned"), "--overwrite")
        cut = json.loads((run / "pruned" / "eval.json").read_text())["acc"]
        for epochs in args.finetune_epochs.split(","):
            for lr in args.lrs.split(","):
                folder = run / f"ft-e{epochs}-lr{lr}"
                slimming("finetune", "--checkpoint", str(run / "pruned" / "pruned.pth"), *data,
                         "--epochs", epochs, "--lr", lr, "--seed", seed, "--save", str(folder), "--overwrite")
                accs = [r["test_acc"] for r in rows(folder / "metrics.jsonl")]
                row = {"seed": int(seed), "trained": trained, "cut": cut, "epochs": int(epochs),
                       "lr": float(lr), "best": max(accs), "last": accs[-1]}
                print(json.dumps(row), flush=True)
                results.append(row)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    print("\n| fine-tune epochs | lr | best - cut (points), per seed | median | last - cut, median |")
    print("|---|---|---|---|---|")
    for epochs in args.finetune_epochs.split(","):
        for lr in args.lrs.split(","):
            mine = [r for r in results if r["epochs"] == int(epochs) and r["lr"] == float(lr)]
            gains = [r["best"] - r["cut"] for r in mine]
            last = statistics.median(r["last"] - r["cut"] for r in mine)
            each = ", ".join(f"{g:+.1f}" for g in gains)
            print(f"| {epochs} | {lr} | {each} | {statistics.median(gains):+.1f} | {last:+.1f} |")


if __name__ == "__main__":
    main()
