"""Time two checkouts of slimming against each other in one run, for a change that must not
cost speed (a refactor): pruning a VGG-19 at 70% in process, one training step of a small VGG
(batch 64, with the L1 term) and one epoch of the fast loader on the synthetic data. Each round
runs both checkouts in fresh processes, alternating, so that both see the same machine; prints
each one's medians and the ratio second / first.

    python benchmarks/compare_trees.py OLD_CHECKOUT NEW_CHECKOUT [--rounds 5]

A checkout is a folder holding slimming/ and models/ (either layout since 0.1: the script uses
only names both have); each is copied to a temporary folder with models/ placed as the
installed package has it (slimming.models).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import guarded, parser, positive_int

CHILD = r"""
import json, statistics, time
import torch
import slimming
from slimming import models
from slimming.data import build_loaders
from slimming.engine import Trainer, make_optimizer, make_scheduler  # 0.1's path: 0.2 keeps it

def median_ms(fn, repeat, warm=1):
    for _ in range(warm):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(1000 * (time.perf_counter() - start))
    return statistics.median(times)

torch.manual_seed(0)
vgg = models.build("vgg", depth=19).eval()
for bn in slimming.prunable_bns(vgg):
    bn.weight.data = torch.rand(bn.num_features) ** 4
prune_ms = median_ms(lambda: slimming.prune(vgg, percent=0.7), 5)
net = models.build("vgg", cfg=[64, "M", 128, "M", 256, "M", 256, "M", 256])
opt = make_optimizer(net)
trainer = Trainer(net, opt, make_scheduler(opt, 1), torch.device("cpu"),
                  sparsity=slimming.BNSparsity(net, 1e-4))
x, y = torch.randn(64, 3, 32, 32), torch.randint(10, (64,))
net.train()
step_ms = median_ms(lambda: trainer.step(x, y), 10, warm=3)
train_loader, _, _ = build_loaders("synthetic", batch_size=64, seed=0, loader="fast")
epoch_ms = median_ms(lambda: [b for b in train_loader], 5)
print(json.dumps({"prune_ms": prune_ms, "step_ms": step_ms, "loader_epoch_ms": epoch_ms}))
"""


def staged(tree: Path, into: Path) -> Path:
    """A copy of ``tree``'s slimming/ with models/ inside it, as installed."""
    shutil.copytree(tree / "slimming", into / "slimming", ignore=shutil.ignore_patterns("__pycache__"))
    if not (into / "slimming" / "models").exists():
        shutil.copytree(tree / "models", into / "slimming" / "models",
                        ignore=shutil.ignore_patterns("__pycache__"))
    return into


def measure(root: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run([sys.executable, "-c", CHILD], cwd=root, env=env, capture_output=True,
                         text=True, timeout=1800)
    if out.returncode != 0:
        sys.exit(f"{root}: {out.stderr.strip().splitlines()[-1]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = parser(__doc__)
    p.add_argument("first", type=Path, help="a checkout (the old one)")
    p.add_argument("second", type=Path, help="a checkout (the new one)")
    p.add_argument("--rounds", type=positive_int, default=5)
    args = p.parse_args()
    for tree in (args.first, args.second):
        if not (tree / "slimming" / "__init__.py").is_file():
            p.error(f"{tree} holds no slimming/ package")
    with tempfile.TemporaryDirectory() as tmp:
        roots = [staged(t, Path(tmp) / name) for t, name in ((args.first, "a"), (args.second, "b"))]
        rows: list[list[dict]] = [[], []]
        for r in range(args.rounds):
            for i in (0, 1) if r % 2 == 0 else (1, 0):
                rows[i].append(measure(roots[i]))
    print(f"{'median of ' + str(args.rounds) + ' rounds':<26} {'first':>10} {'second':>10} {'ratio':>7}")
    for key in rows[0][0]:
        a, b = (statistics.median(row[key] for row in rows[i]) for i in (0, 1))
        print(f"{key:<26} {a:>10.1f} {b:>10.1f} {b / a:>7.3f}")


if __name__ == "__main__":
    sys.exit(guarded(main))
