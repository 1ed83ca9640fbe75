"""Helpers shared by the benchmark scripts (run them as ``python benchmarks/NAME.py``)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch import nn

from slimming.cli.parser import Parser, positive_int  # noqa: F401 (positive_int: for the scripts' flags)
from slimming.errors import SlimmingError
from slimming.pruning.select import prunable_factors


def parser(doc: str | None) -> Parser:
    """The scripts' argument parser: a mistake is one line on stderr and exit code 2, as in
    slimming's own commands."""
    first = (doc or "").strip().split("\n\n")[0]  # the first paragraph, whole
    return Parser(description=" ".join(first.split()) or None)


def guarded(main) -> int:
    """Run a script's ``main()``: a SlimmingError (a missing checkpoint, an unreadable data
    folder) is one line on stderr and exit code 2, as in slimming's commands."""
    try:
        main()
    except SlimmingError as e:
        print(f"{Path(sys.argv[0]).name}: error: {e}", file=sys.stderr)
        return 2
    return 0


def out_folder(text: str) -> Path:
    """An argparse type for an output folder: refused in one line when it, or a folder above it,
    is a file (nothing is created before the check)."""
    path = Path(text)
    for p in [path, *path.parents]:
        if p.exists() and not p.is_dir():
            raise argparse.ArgumentTypeError(f"{p} is a file, not a folder" if p == path else
                                             f"{text}: {p} is a file, not a folder")
    return path


def record_rows(rows, line, out: Path | None) -> list[dict]:
    """Each row of ``rows`` (an iterable that measures as it goes) printed as ``line(row)`` as it
    comes, and the JSON file ``out`` rewritten with every row so far: a later failure keeps them."""
    import json

    kept = []
    for row in rows:
        kept.append(row)
        print(line(row), flush=True)
        if out:
            out.write_text(json.dumps(kept, indent=1))
    return kept


def run(*argv) -> float:
    """``slimming ARGV...`` in this process (printed first); the seconds it took. Exits the
    benchmark when the stage fails."""
    from slimming.cli import main

    argv = [str(a) for a in argv]
    print("$ slimming " + " ".join(argv), flush=True)
    start = time.perf_counter()
    if main(argv) != 0:
        sys.exit(f"stage failed: {' '.join(argv)}")
    return time.perf_counter() - start


def loaders_like(data_root, ckpt: dict, batch_size: int = 64):
    """(train loader, test loader) of the image folder ``data_root`` as the checkpoint ``ckpt``
    was trained on it: its image size, mean and std."""
    from slimming.data import build_loaders

    record = ckpt["data"]
    train, test, _ = build_loaders("imagefolder", data_root, batch_size, seed=0,
                                   image_size=record["image_size"],
                                   norm=(tuple(record["mean"]), tuple(record["std"])))
    return train, test


def accuracy(model: nn.Module, loader) -> float:
    """Top-1 test accuracy (%) of ``model`` in eval mode on the CPU."""
    from slimming.training.engine import evaluate

    return evaluate(model.eval(), loader, torch.device("cpu"), show_progress=False)["acc"]


def sparsity_shaped(model: nn.Module, small: float = 0.7, seed: int = 0) -> None:
    """Set gammas as sparsity training leaves them, seeded: in every scaling factor (BatchNorm,
    GroupNorm, LayerNorm, gate) a fraction ``small`` of channels near zero (1e-3 * N(0, 1)), the
    rest uniform in (0.1, 1)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for bn in prunable_factors(model):
            n = bn.weight.numel()
            near_zero = torch.rand(n, generator=gen) < small
            bn.weight.copy_(torch.where(near_zero, 1e-3 * torch.randn(n, generator=gen),
                                        0.1 + 0.9 * torch.rand(n, generator=gen)))
