"""Time pruning a full VGG-19 (CIFAR, 20.04M parameters) at 70%.

Measures, in one run on the same checkpoint:
  - `slimming prune` as a whole process (python start, imports, load, prune, save), median of 3,
    interleaved with a process that only runs `import torch, torchvision` (the ratio);
  - the in-process `slimming.prune(model, percent=0.7)` call (the default: checked and
    compensated), with `compensate=False`, and with `compensate=False, verify=False`, interleaved,
    median of 7; Torch-Pruning's `BNScalePruner` at 70% (global, the classifier kept, its
    `copy.deepcopy` included), where it is installed;
  - the same call if the new network were built with ordinary initialisation and then
    overwritten (what the paper's code does), for the ratio.

    python benchmarks/prune_time.py
"""

from __future__ import annotations

import copy
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import parser, sparsity_shaped

import slimming
from slimming import models
from slimming.pruning.select import channel_masks, prunable_bns
from slimming.pruning.surgery import copy_chain_weights


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
        imports = [sys.executable, "-c", "import torch, torchvision"]
        whole, bare = interleaved([lambda: subprocess.run(cmd, check=True, capture_output=True),
                                   lambda: subprocess.run(imports, check=True, capture_output=True)], 3)
    calls = [lambda: slimming.prune(model, percent=0.7),
             lambda: slimming.prune(model, percent=0.7, compensate=False),
             lambda: slimming.prune(model, percent=0.7, compensate=False, verify=False)]
    peer = torch_pruning_call(model)
    call, plain, unchecked, *theirs = interleaved(calls + ([peer] if peer else []), 7)
    naive = median_time(lambda: prune_with_init(model, 0.7), 5)
    result = slimming.prune(model, percent=0.7)
    print(f"VGG-19 {slimming.count_params(model) / 1e6:.2f}M -> "
          f"{slimming.count_params(result.model) / 1e6:.2f}M parameters at 70%, "
          f"{torch.get_num_threads()} threads")
    print(f"slimming prune, whole process (median of 3): {whole:.2f} s; import torch, torchvision: "
          f"{bare:.2f} s ({whole / bare:.2f}x)")
    print(f"slimming.prune() in process (median of 7): {call * 1000:.0f} ms (checked, compensated); "
          f"{plain * 1000:.0f} ms compensate=False ({call / plain:.2f}x); {unchecked * 1000:.0f} ms "
          "without the check either")
    if theirs:
        print(f"Torch-Pruning BNScalePruner (median of 7): {theirs[0] * 1000:.0f} ms; ratios "
              f"{call / theirs[0]:.2f}x (default), {plain / theirs[0]:.2f}x (compensate=False), "
              f"{unchecked / theirs[0]:.2f}x (neither)")
    print(f"same with an initialised Net(cfg) (median of 5): {naive * 1000:.0f} ms "
          f"({naive / call:.1f}x the meta-device build)")


def interleaved(fns, repeat):
    """The median time of each of ``fns``, run in turn ``repeat`` times (noise shared alike)."""
    times = [[] for _ in fns]
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            t = time.perf_counter()
            fn()
            times[i].append(time.perf_counter() - t)
    return [statistics.median(t) for t in times]


def torch_pruning_call(model):
    """Torch-Pruning's BNScalePruner at 70% on a copy (the copy counted), or None without it."""
    try:
        import torch_pruning as tp
    except ImportError:
        return None
    example = torch.zeros(1, 3, 32, 32)

    def run():
        m = copy.deepcopy(model)
        pruner = tp.pruner.BNScalePruner(m, example, importance=tp.importance.BNScaleImportance(),
                                         global_pruning=True, pruning_ratio=0.7,
                                         ignored_layers=[m.classifier])
        pruner.step()
        return m
    return run


if __name__ == "__main__":
    parser(__doc__).parse_args()  # no options: --help, and a mistake is refused
    main()
