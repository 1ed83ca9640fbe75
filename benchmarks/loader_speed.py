"""Training throughput with the fast in-memory loader against torchvision's DataLoader.

Sparsity training (SGD lr 0.1, momentum 0.9, weight decay 1e-4, BNSparsity 3e-3, cross-entropy,
batch 64) of a quarter-width VGG-11 on an ImageFolder copy of CIFAR-10, from the same initial
weights with each loader, timed over --steps steps after --warmup steps:

  - fast:        build_loaders(loader="fast"): decoded once into a .pt cache, the whole set held
                 as one uint8 tensor, each batch cropped, flipped and normalised as tensors;
  - torchvision: ImageFolder + transforms v2 + DataLoader with --workers worker processes.

Also reports the one-off decode-and-cache time, the load time from that cache, and each loader
alone (no model) for context. The cache goes to a temporary folder unless --cache-dir is given.

    python benchmarks/loader_speed.py                 # the real run: a quiet machine, 300 steps
    python benchmarks/loader_speed.py --steps 20      # smoke check
"""

from __future__ import annotations

import copy
import os
import platform
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from common import out_folder, parser, positive_int
from torch import nn

from slimming import models
from slimming.data import build_loaders
from slimming.training.sparsity import BNSparsity

REPO = Path(__file__).resolve().parents[1]
CFG = [16, "M", 32, "M", 64, 64, "M", 128, 128, "M", 128, 128]  # quarter-width VGG-11


def endless(loader) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Batches over as many epochs as needed, each epoch selected with set_epoch."""
    epoch = 0
    while True:
        loader.set_epoch(epoch)
        yield from loader
        epoch += 1


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_speed(loader: Iterable, init: dict, device: torch.device, steps: int, warmup: int) -> float:
    """Images per second of sparsity training over ``steps`` steps after ``warmup`` steps."""
    model = models.build("vgg", cfg=CFG, num_classes=10).to(device)
    model.load_state_dict(init)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    sparsity = BNSparsity(model, 3e-3)
    criterion = nn.CrossEntropyLoss()
    batches = endless(loader)
    seen, start = 0, 0.0
    for step in range(warmup + steps):
        if step == warmup:
            sync(device)
            seen, start = 0, time.perf_counter()
        x, y = next(batches)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loss = criterion(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        sparsity.apply()
        optimizer.step()
        seen += len(y)
    sync(device)
    elapsed = time.perf_counter() - start
    if not torch.isfinite(loss):
        raise RuntimeError("non-finite loss: the benchmark's training diverged")
    del batches  # shuts down the DataLoader's workers
    return seen / elapsed


def load_speed(loader: Iterable, device: torch.device, steps: int, warmup: int) -> float:
    """Images per second of the loader alone (batches moved to ``device``, nothing else)."""
    batches = endless(loader)
    seen, start = 0, 0.0
    for step in range(warmup + steps):
        if step == warmup:
            sync(device)
            seen, start = 0, time.perf_counter()
        x, y = next(batches)
        x.to(device, non_blocking=True)
        seen += len(y)
    sync(device)
    del batches
    return seen / (time.perf_counter() - start)


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--data-root", type=Path, default=REPO.parent / "shared" / "data" / "cifar10-jpeg")
    p.add_argument("--steps", type=positive_int, default=300)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--batch-size", type=positive_int, default=64)
    p.add_argument("--workers", type=int, default=2, help="for the torchvision DataLoader")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--cache-dir", type=out_folder, default=None,
                   help="decoded-image cache (default: a temporary folder, so decoding is timed)")
    args = p.parse_args()
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__} on {platform.processor() or platform.machine()}, device {device}, "
          f"torch.get_num_threads() = {torch.get_num_threads()}, os.cpu_count() = {os.cpu_count()}, "
          f"load average {os.getloadavg()[0]:.2f}")
    if os.getloadavg()[0] > 0.5 * (os.cpu_count() or 1):
        print("note: the machine is busy; on a CPU the figures below mean little (OpenMP threads "
              "wait for each other when another job shares the cores)")
    print(f"data {args.data_root}, batch {args.batch_size}, {args.warmup} warm-up + {args.steps} timed steps")

    with tempfile.TemporaryDirectory() as tmp:
        cache = args.cache_dir or Path(tmp)
        common = dict(name="imagefolder", root=args.data_root, batch_size=args.batch_size, seed=0)
        start = time.perf_counter()
        build_loaders(**common, loader="fast", device=device, cache_dir=cache)
        first = time.perf_counter() - start
        start = time.perf_counter()
        fast, _, num_classes = build_loaders(**common, loader="fast", device=device, cache_dir=cache)
        cached = time.perf_counter() - start
    print(f"fast loader: first build (decode + write cache, or cache hit) {first:.2f} s, "
          f"from the cache {cached:.2f} s, {fast.dataset_size:,} training images")
    slow, _, _ = build_loaders(**common, loader="torchvision", workers=args.workers,
                               pin_memory=device.type == "cuda")

    torch.manual_seed(0)
    init = copy.deepcopy(models.build("vgg", cfg=CFG, num_classes=num_classes).state_dict())
    fast_train = train_speed(fast, init, device, args.steps, args.warmup)
    slow_train = train_speed(slow, init, device, args.steps, args.warmup)
    fast_load = load_speed(fast, device, args.steps, args.warmup)
    slow_load = load_speed(slow, device, args.steps, args.warmup)
    print(f"sparsity training, fast loader:        {fast_train:8.0f} images/s")
    print(f"sparsity training, torchvision loader: {slow_train:8.0f} images/s "
          f"({args.workers} workers)")
    print(f"ratio fast / torchvision:              {fast_train / slow_train:8.2f}x")
    print(f"loader alone: fast {fast_load:.0f} images/s, torchvision {slow_load:.0f} images/s")


if __name__ == "__main__":
    main()
