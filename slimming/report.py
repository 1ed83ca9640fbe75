"""``slimming report --run DIR``: what pruning bought, as Markdown + JSON (+ PNG pictures).

A run folder is what ``slimming pipeline`` writes: ``baseline/`` (optional, no sparsity),
``sparse/`` (sparsity training), ``pruned/pruned.pth`` (+ ``eval.json``, the accuracy right
after pruning) and ``finetuned/``. Stages that are missing are left out of the report.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from . import plots
from .checkpoint import load_checkpoint, model_from_checkpoint
from .prune import prunable_bns
from .stats import model_stats


def _read_metrics(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def _stage_checkpoint(folder: Path) -> Path | None:
    for name in ("best.pth", "last.pth", "pruned.pth"):
        if (folder / name).exists():
            return folder / name
    return None


def build_report(run: str | Path, latency_repeats: int = 10) -> dict:
    """Gather the figures of a run folder: per stage accuracy, parameters, FLOPs, latency on
    the CPU (batch 1 and 64), the per-layer channels kept, the gammas and the training curves."""
    run = Path(run)
    if not run.is_dir():
        raise ValueError(f"{run}: no such run folder")
    stages: dict[str, dict] = {}
    models: dict[str, nn.Module] = {}
    pruned_ckpt = None
    for name in ("baseline", "sparse", "pruned", "finetuned"):
        path = _stage_checkpoint(run / name)
        if path is None:
            continue
        ckpt = load_checkpoint(path)
        if name == "pruned":
            pruned_ckpt = ckpt
        model = model_from_checkpoint(ckpt, path).eval()
        models[name] = model
        acc = ckpt.get("best_acc", ckpt.get("acc"))
        if name == "pruned":
            done = run / name / "eval.json"
            acc = json.loads(done.read_text())["acc"] if done.exists() else None
        stats = model_stats(model, repeats=latency_repeats)
        stages[name] = {"checkpoint": str(path), "acc": acc, "epochs": ckpt.get("epoch"),
                        "cfg": model.cfg, **stats}
    if not stages:
        raise ValueError(f"{run}: holds no stage folder with a checkpoint (baseline/, sparse/, "
                         "pruned/, finetuned/)")
    report: dict = {"run": str(run), "stages": stages, "layers": [], "threshold": None,
                    "percent": None}
    if pruned_ckpt is not None:
        report["threshold"] = pruned_ckpt.get("threshold")
        report["percent"] = pruned_ckpt.get("percent")
        masks = pruned_ckpt.get("cfg_mask") or []
        source = models.get("sparse")
        names = ([n for n, m in source.named_modules() if isinstance(m, nn.BatchNorm2d)]
                 if source is not None else [])
        if len(names) != len(masks):
            names = [f"bn{i}" for i in range(len(masks))]
        report["layers"] = [(n, int(m.numel()), int(m.sum())) for n, m in zip(names, masks)]
    report["curves"] = {name: _read_metrics(run / name / "metrics.jsonl")
                        for name in ("baseline", "sparse", "finetuned")
                        if (run / name / "metrics.jsonl").exists()}
    report["gammas"] = {name: torch.cat([bn.weight.detach().abs() for bn in prunable_bns(models[name])])
                        for name in ("sparse", "baseline") if name in models}
    return report


def _ratio(a, b) -> str:
    return f"{b / a:.3f}x" if a else "-"


def write_report(report: dict, run: str | Path) -> list[Path]:
    """report.md, report.json and (with matplotlib) gammas.png, channels.png, curves.png."""
    run = Path(run)
    stages = report["stages"]
    pictures: list[str] = []
    if plots.available():
        if report["gammas"]:
            plots.gamma_histogram(report["gammas"], report["threshold"], run / "gammas.png")
            pictures.append("gammas.png")
        if report["layers"]:
            plots.channels_kept(report["layers"], run / "channels.png")
            pictures.append("channels.png")
        if any(report["curves"].values()):
            plots.training_curves(report["curves"], run / "curves.png")
            pictures.append("curves.png")
    md = [f"# Slimming report: {run}", ""]
    md += ["| stage | top-1 | parameters | FLOPs | latency b1 | latency b64 | cfg |",
           "|---|---|---|---|---|---|---|"]
    for name, s in stages.items():
        acc = "not measured" if s["acc"] is None else f"{s['acc']:.2f}%"
        lat = s["latency_ms"]
        md.append(f"| {name} | {acc} | {s['params'] / 1e6:.3f}M | {s['flops']:.3e} | "
                  f"{lat.get(1, float('nan')):.2f} ms | {lat.get(64, float('nan')):.2f} ms | "
                  f"`{s['cfg']}` |")
    before = stages.get("sparse") or stages.get("baseline")
    after = stages.get("finetuned") or stages.get("pruned")
    if before and after and before is not after:
        md += ["", f"After / before: parameters {_ratio(before['params'], after['params'])}, "
               f"FLOPs {_ratio(before['flops'], after['flops'])}, latency batch 1 "
               f"{_ratio(before['latency_ms'].get(1), after['latency_ms'].get(1))}, batch 64 "
               f"{_ratio(before['latency_ms'].get(64), after['latency_ms'].get(64))} "
               "(CPU, median of repeated runs)."]
    if report["layers"]:
        thr = report["threshold"]
        md += ["", f"Pruned {report['percent'] if report['percent'] is not None else '-'} of "
               f"channels; |gamma| threshold {thr if thr is None else f'{thr:.4g}'}.", "",
               "| layer | channels before | after |", "|---|---|---|"]
        md += [f"| {n} | {b} | {a} |" for n, b, a in report["layers"]]
    md += [""]
    if pictures:
        md += [f"![{p[:-4]}]({p})" for p in pictures]
    else:
        md += [f"No pictures: {plots.MISSING}." if not plots.available() else "No pictures."]
    (run / "report.md").write_text("\n".join(md) + "\n")
    data = {k: v for k, v in report.items() if k != "gammas"}
    data["pictures"] = pictures
    (run / "report.json").write_text(json.dumps(data, indent=1, default=str))
    return [run / "report.md", run / "report.json", *(run / p for p in pictures)]
