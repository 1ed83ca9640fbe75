"""Prune at many percents in memory and evaluate each without fine-tuning, so that a user can
pick a percent before spending a fine-tune."""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from ..errors import BudgetError, SlimmingError, first_line
from ..measure.stats import DEFAULT_INPUT_SIZE, count_flops, count_params
from ..pruning.prune import prune
from ..training.engine import evaluate
from ..utils import progress
from ..utils.files import write_text
from . import plots

MAX_POINTS = 100  # each point prunes and evaluates the whole network
FIELDS = ("percent", "threshold", "params", "params_kept", "flops", "flops_kept", "acc", "loss",
          "reference")


def _shown(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:37] + "...")


def parse_percents(text: str, name: str = "--percents") -> list[float]:
    """``"0.1:0.9:0.1"`` (start:stop:step, stop included) or ``"0.5,0.7"`` -> sorted percents
    without duplicates, each in [0, 1), at most ``MAX_POINTS`` of them. Anything else raises
    SlimmingError (one line) naming the flag ``name``; a range's size is computed before any
    list is built."""
    flag = f"{name} {_shown(str(text))}"
    of = {"--percents": "of channels to remove", "--target-latency": "of the unpruned model's latency"}.get(
        name, "of the unpruned model's count")
    noun = "percent" if name == "--percents" else "budget"
    usage = (f"{flag}: use start:stop:step (e.g. 0.1:0.9:0.1) or a comma list "
             f"(e.g. 0.5,0.7) of fractions {of}")
    text = str(text).strip()
    try:
        if ":" in text:
            parts = text.split(":")
            if len(parts) != 3:
                raise ValueError
            start, stop, step = (float(v) for v in parts)
            numbers = [start, stop, step]
        else:
            numbers = [float(v) for v in text.split(",")]
    except ValueError:
        raise SlimmingError(usage) from None
    if not all(math.isfinite(v) for v in numbers):
        raise SlimmingError(f"{flag}: nan and inf are no {noun}s; every {noun} must be a fraction {of}, "
                            f"in {'[0, 1)' if noun == 'percent' else '(0, 1)'}")
    if ":" in text:
        if not 0 <= start < 1:
            raise SlimmingError(f"{flag}: the start must be in [0, 1), got {start:g}")
        if step <= 0:
            raise SlimmingError(f"{flag}: the step must be > 0, got {step:g}")
        if stop < start:
            raise SlimmingError(f"{flag}: the stop ({stop:g}) is below the start ({start:g}): "
                                "no point to sweep")
        span = (stop - start) / step  # finite: all three are finite and step > 0 (or inf: huge)
        if not math.isfinite(span) or span + 1 > MAX_POINTS + 1e-6:
            raise SlimmingError(f"{flag}: {_count(span + 1)} points; at most {MAX_POINTS} per "
                                "sweep (each prunes and evaluates the network): use a larger step")
        n = math.floor(span + 1e-9) + 1
        values = [round(start + i * step, 10) for i in range(n)]
    else:
        values = numbers
    if any(not 0 <= v < 1 for v in values):
        bad = next(v for v in values if not 0 <= v < 1)
        what = ("percent must be in [0, 1) (the fraction of channels removed)" if name == "--percents"
                else f"budget must be a fraction in (0, 1) {of}")
        raise SlimmingError(f"{flag}: every {what}, got {bad:g}")
    values = sorted(set(values))
    if len(values) > MAX_POINTS:
        raise SlimmingError(f"{flag}: {len(values)} points; at most {MAX_POINTS} per sweep (each "
                            "prunes and evaluates the network)")
    return values


def _count(n: float) -> str:
    return f"{n:.3g}" if math.isfinite(n) else "too many"


def sweep(model: nn.Module, test_loader: Iterable, device: torch.device, percents: list[float],
          min_channels: int = 1, input_size: tuple[int, ...] = DEFAULT_INPUT_SIZE, *,
          axis: str = "percent", options: dict | None = None, repair=None) -> list[dict]:
    """Rows of ``FIELDS``. The first row is the unpruned network, evaluated once: percent 0.0,
    threshold None, everything kept, ``"reference": True``. Then one row per point above 0
    (percent 0 removes nothing: it is the reference row), in increasing order: the |gamma|
    threshold, params, FLOPs, their fractions kept, and the test accuracy (%) and loss of the
    pruned network, before any fine-tuning (``"reference": False``). A budget no cut reaches (the
    smallest network the limits allow is above it) is a row of its own with ``met`` False, its
    measurements None and ``missed`` saying why, and the sweep goes on.

    ``axis``: "percent" (the points are fractions of channels removed), "flops", "params" or
    "latency" (the points are budgets, fractions of the unpruned count or measured latency:
    each row also has ``target``, and ``percent`` is then the fraction of channels the budget
    removed; a latency row also has ``latency_ms`` and ``latency_kept``, as measured, and so
    has the reference row). ``options``: more
    keywords for ``slimming.prune`` (round_to, max_layer_prune, compensate). ``repair``: called
    on each pruned network before it is evaluated (e.g. BatchNorm recalibration)."""
    params0, flops0 = count_params(model), count_flops(model, input_size)
    m = evaluate(model.to(device), test_loader, device)
    rows = [{"percent": 0.0, "threshold": None, "params": params0, "params_kept": 1.0,
             "flops": flops0, "flops_kept": 1.0, "acc": m["acc"], "loss": m["loss"],
             "reference": True}]
    keyword = {"percent": "percent", "flops": "target_flops", "params": "target_params",
               "latency": "target_latency"}[axis]
    points = [p for p in sorted(set(percents)) if p != 0]
    for p in progress.bar(points, desc=f"sweep ({axis})", unit="point"):
        try:
            result = prune(model, **{keyword: p}, min_channels=min_channels, **(options or {}))
        except BudgetError as e:  # no cut reaches it: a row that says so, and the sweep goes on
            rows.append({**{k: None for k in FIELDS}, "reference": False, "target": p, "met": False,
                         "missed": first_line(e, 200)})
            continue
        if repair is not None:
            repair(result.model)
        m = evaluate(result.model.to(device), test_loader, device)
        params, flops = count_params(result.model), count_flops(result.model, input_size)
        cut = sum(int((~k).sum()) for k in result.cfg_mask) / sum(k.numel() for k in result.cfg_mask)
        row = {"percent": p if axis == "percent" else round(cut, 4), "threshold": result.threshold,
               "params": params, "params_kept": params / params0, "flops": flops,
               "flops_kept": flops / flops0, "acc": m["acc"], "loss": m["loss"], "reference": False}
        if axis != "percent":
            row["target"] = p
        if axis in ("flops", "params"):
            row["met"] = result.budget.met
        if axis == "latency":
            b = result.budget
            row.update(latency_ms=b.ms, latency_ms_spread=b.ms_spread, latency_kept=b.ratio,
                       latency_kept_spread=b.ratio_spread, met=b.met)
            rows[0].update(latency_ms=b.original_ms, latency_ms_spread=b.original_spread,
                           latency_kept=1.0)  # the last measurement of it
        rows.append(row)
    return rows


def _csv(rows: list[dict]) -> str:
    fields = list(dict.fromkeys([*FIELDS, *(k for r in rows for k in r)]))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: ("" if v is None else str(v).lower() if isinstance(v, bool) else v)
                         for k, v in r.items()})
    return buf.getvalue()


def _markdown(rows: list[dict]) -> str:
    """One measurement per cell: the budget asked (where the points are budgets) and whether
    the cut met it, the share of channels removed, the counts and what they keep, the latency
    and its share of the original's (each +- its spread), the accuracy."""
    timed = any("latency_ms" in r for r in rows)
    budgets = any("target" in r for r in rows)
    head = ["channels removed", "params", "params kept", "FLOPs", "FLOPs kept"]
    head = (["budget asked", "met"] if budgets else []) + head
    head += ["latency (measured)", "of the original's"] if timed else []
    head += ["top-1 (no fine-tune)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = []
        if r.get("acc") is None:  # a budget no cut reached (``sweep``'s "missed")
            cells = [f"{r['target']:g}", "**missed**", f"no cut reaches it: {r.get('missed', '')}"]
            lines.append("| " + " | ".join(cells + [""] * (len(head) - len(cells))) + " |")
            continue
        if budgets:
            asked = "-" if r.get("reference") else f"{r['target']:g}"
            cells += [asked, "-" if r.get("reference") else ("yes" if r.get("met", True) else "**missed**")]
        cells += ["0 (unpruned)" if r.get("reference") else f"{r['percent']:g}",
                  f"{r['params'] / 1e6:.3f}M", f"{100 * r['params_kept']:.1f}%", f"{r['flops']:.3e}",
                  f"{100 * r['flops_kept']:.1f}%"]
        if timed:
            cells += [f"{r['latency_ms']:.3g} +- {r.get('latency_ms_spread', 0):.2g} ms",
                      f"{r['latency_kept']:.3f} +- {r.get('latency_kept_spread', 0):.3f}"]
        cells.append(f"{r['acc']:.2f}%")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_sweep(rows: list[dict], save: str | os.PathLike) -> list[Path]:
    """sweep.csv, sweep.json, sweep.md and (with matplotlib, ``plots.available()``) sweep.png
    in ``save``, each written atomically (slimming.utils.files); the paths written."""
    save = Path(save)
    save.mkdir(parents=True, exist_ok=True)
    write_text(save / "sweep.csv", _csv(rows))
    write_text(save / "sweep.json", json.dumps(rows, indent=1))
    write_text(save / "sweep.md", _markdown(rows))
    written = [save / "sweep.csv", save / "sweep.json", save / "sweep.md"]
    if plots.available():
        plots.sweep_curves(rows, save / "sweep.png")
        written.append(save / "sweep.png")
    return written
