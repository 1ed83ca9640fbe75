"""Time pruning a full VGG-19 (CIFAR, 20.04M parameters) at 70%.

Measures, in one run on the same checkpoint:
  - `slimming prune` as a whole process (python start, imports, load, prune, save), median of 3;
  - the in-process `slimming.prune(model, percent=0.7)` call, median of 5;
  - the same call if the new network were built with ordinary initialisation and then
    overwritten (what the paper's code does), for the ratio.

    python benchmarks/prune_time.py
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import sparsity_shaped

import slimming
from slimming import models
from slimming.pruning.prune import copy_chain_weights
from slimming.pruning.select import channel_masks, prunable_bns


def prune_with_init(model, percent):
    """The paper's way: a fully initialised Net(cfg), then its weights overwritten."""
    masks, _ = channel_masks(model, percent=percent)
    by_layer = {id(bn): m for bn, m in zip(prunable_bns(model), masks)}
    cfg_mask = [by_layer[id(bn)] for bn in model.modules() if isinstance(bn, torch.nn.BatchNorm2d)]
    new = models.build("vgg", cfg=model.pruned_cfg([int(m.sum()) for m in masks]))
    copy_chain_weights(model, new, cfg_mask)  # assign=True replaces the initialised tensors
    return new


def median_time(fn, repeat):
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main():
    torch.manual_seed(0)
    model = models.build("vgg", depth=19).eval()
    sparsity_shaped(model)
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "vgg19.pth"
        slimming.save_checkpoint(slimming.checkpoint_dict(model), ckpt)
        cmd = [sys.executable, "-m", "slimming", "prune", "--checkpoint", str(ckpt),
               "--percent", "0.7", "--save", tmp, "--overwrite"]
        whole = median_time(lambda: subprocess.run(cmd, check=True, capture_output=True), 3)
    call = median_time(lambda: slimming.prune(model, percent=0.7), 5)
    naive = median_time(lambda: prune_with_init(model, 0.7), 5)
    result = slimming.prune(model, percent=0.7)
    print(f"VGG-19 {slimming.count_params(model) / 1e6:.2f}M -> "
          f"{slimming.count_params(result.model) / 1e6:.2f}M parameters at 70%")
    print(f"slimming prune, whole process (median of 3): {whole:.2f} s")
    print(f"slimming.prune() in process (median of 5):   {call * 1000:.0f} ms")
    print(f"same with an initialised Net(cfg) (median of 5): {naive * 1000:.0f} ms "
          f"({naive / call:.1f}x the meta-device build)")


if __name__ == "__main__":
    main()
