"""Prune at many percents in memory and evaluate each without fine-tuning, so that a user can
pick a percent before spending a fine-tune."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from . import plots
from .engine import evaluate
from .prune import prune
from .stats import count_flops, count_params


def parse_percents(text: str) -> list[float]:
    """``"0.1:0.9:0.1"`` (start:stop:step, stop included) or ``"0.5,0.7"`` -> percents."""
    try:
        if ":" in text:
            start, stop, step = (float(v) for v in text.split(":"))
            if step <= 0:
                raise ValueError
            n = int(round((stop - start) / step)) + 1
            values = [round(start + i * step, 10) for i in range(max(n, 0))]
        else:
            values = [float(v) for v in text.split(",")]
    except ValueError:
        raise ValueError(f"--percents {text!r}: use start:stop:step (e.g. 0.1:0.9:0.1) or a "
                         "comma list (e.g. 0.5,0.7)") from None
    if not values or any(not 0 <= v < 1 for v in values):
        raise ValueError(f"--percents {text!r}: every percent must be in [0, 1)")
    return values


def sweep(model: nn.Module, test_loader: Iterable, device: torch.device, percents: list[float],
          min_channels: int = 1, input_size: tuple[int, ...] = (3, 32, 32)) -> list[dict]:
    """One row per percent: percent, threshold, params, flops, their fractions kept, test
    accuracy (%) and loss of the pruned network, before any fine-tuning."""
    params0, flops0 = count_params(model), count_flops(model, input_size)
    rows = []
    for p in percents:
        result = prune(model, percent=p, min_channels=min_channels)
        m = evaluate(result.model.to(device), test_loader, device)
        params, flops = count_params(result.model), count_flops(result.model, input_size)
        rows.append({"percent": p, "threshold": result.threshold, "params": params,
                     "params_kept": params / params0, "flops": flops, "flops_kept": flops / flops0,
                     "acc": m["acc"], "loss": m["loss"]})
    return rows


def write_sweep(rows: list[dict], save: Path) -> list[Path]:
    """sweep.csv, sweep.json, sweep.md and (with matplotlib) sweep.png in ``save``."""
    save.mkdir(parents=True, exist_ok=True)
    with open(save / "sweep.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (save / "sweep.json").write_text(json.dumps(rows, indent=1))
    lines = ["| percent | params | params kept | FLOPs | FLOPs kept | top-1 (no fine-tune) |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['percent']:g} | {r['params'] / 1e6:.3f}M | {100 * r['params_kept']:.1f}% | "
              f"{r['flops']:.3e} | {100 * r['flops_kept']:.1f}% | {r['acc']:.2f}% |" for r in rows]
    (save / "sweep.md").write_text("\n".join(lines) + "\n")
    written = [save / "sweep.csv", save / "sweep.json", save / "sweep.md"]
    if plots.available():
        plots.sweep_curves(rows, save / "sweep.png")
        written.append(save / "sweep.png")
    return written
