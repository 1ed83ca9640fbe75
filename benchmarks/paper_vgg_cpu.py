"""The paper's VGG row (CIFAR-10, prune 70%), reproduced at CPU scale, plus full VGG-19 speed.

Part 1, on the CIFAR-10 JPEG copy (about 25-30 minutes on 2 CPU cores): a quarter-width
VGG-11 trained without sparsity (baseline) and with sparsity, pruned at 50% and 70%
(accuracy right after pruning), each fine-tuned; accuracy, parameters, FLOPs and CPU latency
at batch 1 and 64 for every model.
Part 2: full-size VGG-19 with a sparsity-shaped gamma distribution pruned at 70%: CPU latency
speedup next to the FLOPs reduction, batch 1 and 64.

    python benchmarks/paper_vgg_cpu.py [--data-root ../shared/data/cifar10-jpeg] [--out runs/paper-vgg-cpu]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
from common import guarded, out_folder, parser, positive_int, sparsity_shaped

import slimming
from slimming import models
from slimming.cli import main as slimming_main
from slimming.measure.stats import model_stats

CFG = "16,M,32,M,64,64,M,128,128,M,128,128"


def run(*argv: str) -> None:
    print("$ slimming " + " ".join(argv), flush=True)
    if slimming_main(list(argv)) != 0:
        sys.exit(f"stage failed: {' '.join(argv)}")


def evaluate(path: Path, data: list[str]) -> float:
    from slimming.data import build_loaders
    from slimming.training.engine import evaluate as ev

    _, test_loader, _ = build_loaders("imagefolder", data[data.index("--data-root") + 1], 256)
    return ev(slimming.load_model(path), test_loader, torch.device("cpu"))["acc"]


def part1(root: Path, out: Path, epochs: int, ft_epochs: int, sparsity: float) -> list[dict]:
    data = ["--dataset", "imagefolder", "--data-root", str(root), "--cpu", "--seed", "0"]
    train = ["train", "--arch", "vgg", "--cfg", CFG, "--epochs", str(epochs), *data, "--resume", "auto"]
    run(*train, "--save", str(out / "baseline"))
    run(*train, "--sparsity", str(sparsity), "--save", str(out / "sparse"))
    rows = [("baseline", out / "baseline" / "last.pth"),
            ("sparse (before pruning)", out / "sparse" / "last.pth")]
    for pct in (50, 70):
        pruned = out / f"pruned{pct}" / "pruned.pth"
        if not pruned.exists():
            run("prune", "--checkpoint", str(out / "sparse" / "last.pth"), "--percent", str(pct / 100),
                "--save", str(pruned.parent))
        run("finetune", "--checkpoint", str(pruned), "--epochs", str(ft_epochs), "--lr", "0.01", *data,
            "--resume", "auto", "--save", str(out / f"finetuned{pct}"))
        rows += [(f"pruned {pct}%, no fine-tune", pruned),
                 (f"pruned {pct}% + fine-tune {ft_epochs} ep", out / f"finetuned{pct}" / "last.pth")]
    table = []
    for name, path in rows:
        model = slimming.load_model(path)
        stats = model_stats(model, repeats=20)
        table.append({"model": name, "acc": evaluate(path, data), "params": stats["params"],
                      "flops": stats["flops"], "lat1": stats["latency_ms"][1],
                      "lat64": stats["latency_ms"][64], "cfg": model.cfg})
    return table


def part2() -> dict:
    torch.manual_seed(0)
    model = models.build("vgg", depth=19).eval()
    sparsity_shaped(model, small=0.7)
    pruned = slimming.prune(model, percent=0.7).model.eval()
    a, b = model_stats(model, repeats=20), model_stats(pruned, repeats=20)
    return {"params": (a["params"], b["params"]), "flops": (a["flops"], b["flops"]),
            "lat1": (a["latency_ms"][1], b["latency_ms"][1]),
            "lat64": (a["latency_ms"][64], b["latency_ms"][64])}


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--data-root", type=Path, default=Path("../shared/data/cifar10-jpeg"))
    p.add_argument("--out", type=out_folder, default=Path("runs/paper-vgg-cpu"))
    p.add_argument("--epochs", type=positive_int, default=15)
    p.add_argument("--finetune-epochs", type=positive_int, default=8)
    p.add_argument("--sparsity", type=float, default=3e-3)
    p.add_argument("--skip-part1", action="store_true")
    args = p.parse_args()
    start = time.time()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    if not args.skip_part1:
        table = part1(args.data_root, args.out, args.epochs, args.finetune_epochs, args.sparsity)
        print("\n| model | test top-1 | parameters | FLOPs | CPU latency b1 | CPU latency b64 |")
        print("|---|---|---|---|---|---|")
        for r in table:
            print(f"| {r['model']} | {r['acc']:.2f}% | {r['params'] / 1e6:.3f}M | {r['flops']:.3e} | "
                  f"{r['lat1']:.2f} ms | {r['lat64']:.1f} ms |")
        (args.out / "table.json").write_text(json.dumps(table, indent=1))
    r = part2()
    print("\nFull VGG-19, sparsity-shaped gammas, pruned 70%:")
    print(f"parameters {r['params'][0] / 1e6:.2f}M -> {r['params'][1] / 1e6:.2f}M; FLOPs "
          f"{r['flops'][0]:.3e} -> {r['flops'][1]:.3e} ({r['flops'][0] / r['flops'][1]:.2f}x fewer)")
    for b in ("lat1", "lat64"):
        before, after = r[b]
        print(f"latency batch {b[3:]}: {before:.2f} ms -> {after:.2f} ms ({before / after:.2f}x faster)")
    print(f"total {time.time() - start:.0f} s")


if __name__ == "__main__":
    sys.exit(guarded(main))
