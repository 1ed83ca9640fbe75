"""``slimming report --run DIR``: what pruning bought, as Markdown + JSON (+ PNG pictures).

A run folder is what ``slimming pipeline`` writes: ``baseline/`` (optional, no sparsity),
``sparse/`` (sparsity training), ``pruned/pruned.pth`` (+ ``eval.json``, the accuracy right
after pruning) and ``finetuned/``. Stages that are missing are left out of the report. It may
also be one command's ``--save`` folder (``slimming train``, ``prune`` or ``finetune``): its
stage is told by its checkpoint (``pruned.pth``: pruned; a training run that started from
another checkpoint: finetuned; one with sparsity: sparse; else baseline), and the folders its
checkpoints name as their source (the pruned network's sparse run, ...) give the stages before
it, where they are still there.

What is read is checked, and bounded, before it is used:

- ``*/metrics.jsonl`` (at most ``MAX_METRICS_BYTES``): a row is used only when it is a JSON
  object on one UTF-8 line with an integer ``epoch`` in [0, ``MAX_EPOCH``] and finite numbers
  for ``test_acc`` and ``train_loss`` (the plotted keys); other rows are skipped and counted
  (``report["skipped_rows"]``). Of two rows for one epoch (a resumed run redoes an epoch) the
  later one is kept. Of a used row, only the known keys holding finite numbers are kept.
- ``pruned/eval.json`` (at most ``MAX_EVAL_BYTES``) must be a JSON object whose ``acc`` is a
  number in [0, 100], and the pruned checkpoint's ``cfg_mask`` a list of 1-d bool tensors, one
  per BatchNorm2d of its network, each keeping as many channels as that layer has; otherwise
  SlimmingError, one line naming the file.
- A checkpoint's ``acc``/``best_acc``, ``epoch``, ``threshold`` and ``percent`` that are not
  finite numbers (integers for ``epoch``) are reported as not recorded.
"""

from __future__ import annotations

import json
import math
import stat
from pathlib import Path

import torch
from torch import nn

from ..errors import SlimmingError, clip
from ..io.checkpoint import load_checkpoint, model_from_checkpoint
from ..layers.rules import factor_width, is_factor_layer
from ..measure.stats import compare_stats, input_size_of
from ..models import describe_cfg
from ..pruning.records import LatencyBudget
from ..pruning.select import prunable_factors
from ..utils.files import write_text
from . import plots

MAX_METRICS_BYTES = 8 * 2**20  # a 160-epoch log is about 40 KB
MAX_EVAL_BYTES = 2**20  # eval.json is about 60 bytes
MAX_EPOCH = 1_000_000
PLOTTED = ("test_acc", "train_loss")
KNOWN = ("lr", "train_loss", "train_acc", "test_loss", "test_acc", "gamma_lt_1e-2", "amp_skipped",
         "seconds")
STAGES = BASELINE, SPARSE, PRUNED, FINETUNED = ("baseline", "sparse", "pruned", "finetuned")  # folders
TRAINED = (BASELINE, SPARSE, FINETUNED)  # the stages with a metrics.jsonl


def _number(v) -> float | None:
    """``v`` as a finite float, or None when it is not a finite int/float (bools excluded)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        v = float(v)
    except OverflowError:  # an int too large for a float
        return None
    return v if math.isfinite(v) else None


def _read_small(path: Path, limit: int, fix: str) -> bytes:
    """The bytes of the regular file ``path``, refusing (one line) anything over ``limit``."""
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            raise SlimmingError(f"{path}: not a regular file; {fix}")
        if st.st_size > limit:
            raise SlimmingError(f"{path}: {st.st_size:,} bytes, more than the {limit:,} this "
                                f"file can hold; not reading it: {fix}")
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise SlimmingError(f"{path}: cannot read it ({e.strerror or e}); {fix}") from None
    if len(data) > limit:  # grew after stat()
        raise SlimmingError(f"{path}: more than the {limit:,} bytes this file can hold; not "
                            f"reading it: {fix}")
    return data


def _json(data: bytes):
    """Parsed JSON, or ValueError for anything that is not (bad UTF-8, too deeply nested)."""
    try:
        return json.loads(data.decode("utf-8"))
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _read_metrics(path: Path) -> tuple[list[dict], int]:
    """(usable rows sorted by epoch, number of rows skipped): the rule in the module docstring."""
    data = _read_small(path, MAX_METRICS_BYTES, "it is not a metrics log of slimming train; "
                       "move it away to report without it")
    by_epoch: dict[int, dict] = {}
    skipped = 0
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        try:
            row = _json(line)
        except ValueError:
            skipped += 1
            continue
        epoch = row.get("epoch") if isinstance(row, dict) else None
        if (not isinstance(epoch, int) or isinstance(epoch, bool) or not 0 <= epoch <= MAX_EPOCH
                or any(_number(row.get(k)) is None for k in PLOTTED)):
            skipped += 1
            continue
        kept = {k: _number(row.get(k)) for k in KNOWN}
        by_epoch[epoch] = {"epoch": epoch, **{k: v for k, v in kept.items() if v is not None}}
    return [by_epoch[e] for e in sorted(by_epoch)], skipped


def _read_eval(path: Path) -> float:
    """The accuracy (%) in ``pruned/eval.json``; SlimmingError naming the file otherwise."""
    fix = "delete it and rerun slimming pipeline, which evaluates the pruned network again"
    data = _read_small(path, MAX_EVAL_BYTES, fix)
    try:
        obj = _json(data)
    except ValueError:
        raise SlimmingError(f"{path}: not valid JSON; {fix}") from None
    if not isinstance(obj, dict):
        raise SlimmingError(f"{path}: not a JSON object with an 'acc'; {fix}")
    acc = _number(obj.get("acc"))
    if acc is None or not 0 <= acc <= 100:
        raise SlimmingError(f"{path}: 'acc' must be a number in [0, 100] (top-1 %), got "
                            f"{clip(obj.get('acc'), 40)}; {fix}")
    return acc


def _layers(masks, model: nn.Module, path: Path, names=None) -> list[tuple[str, int, int]]:
    """(layer name, channels before, after) from a pruned checkpoint's ``cfg_mask``: one mask per
    layer it names (``layer_names``: the original's factor layers, gates folded away since
    included), or, in a file without them, per BatchNorm2d of the network."""
    fix = "prune again (slimming prune, or delete it and rerun slimming pipeline)"
    found = dict(model.named_modules())
    if isinstance(names, list) and all(isinstance(n, str) for n in names):
        bns = [(n, found.get(n)) for n in names]
    else:
        bns = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.BatchNorm2d)]
    if not isinstance(masks, (list, tuple)):
        raise SlimmingError(f"{path}: cfg_mask is a {type(masks).__name__}, not a list of bool "
                            f"masks; {fix}")
    if len(masks) != len(bns):
        raise SlimmingError(f"{path}: cfg_mask has {len(masks)} masks for the {len(bns)} "
                            f"BatchNorm layers of its network; {fix}")
    layers = []
    for i, (mask, (name, bn)) in enumerate(zip(masks, bns)):
        if (not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.dim() != 1
                or mask.layout != torch.strided):
            raise SlimmingError(f"{path}: cfg_mask[{i}] is not a 1-d bool tensor; {fix}")
        kept = int(mask.sum())
        # None: a gate, folded into the layer it fed (or a name that is no factor layer)
        width = factor_width(bn) if bn is not None and is_factor_layer(bn) else None
        if width is not None and kept != width:
            raise SlimmingError(f"{path}: cfg_mask[{i}] keeps {kept} channels but layer {name} "
                                f"has {width}; {fix}")
        layers.append((name, int(mask.numel()), kept))
    return layers


def _stage_checkpoint(folder: Path) -> Path | None:
    for name in ("best.pth", "last.pth", "pruned.pth"):
        if (folder / name).exists():
            return folder / name
    return None


def _stage_folders(run: Path, arch: str | None, loaded: dict[Path, dict]) -> dict[str, Path]:
    """{stage: folder holding its checkpoint}, in STAGES order: a pipeline's stage folders, or
    ``run`` itself and the folders its checkpoints name as their sources (module docstring);
    the checkpoints it read, by path, in ``loaded``."""
    found = {name: run / name for name in STAGES if _stage_checkpoint(run / name) is not None}
    folder, seen = run, set()
    while not found.keys() & {"sparse", "baseline"} and folder not in seen:
        path = _stage_checkpoint(folder)
        if path is None:
            break
        seen.add(folder)
        ckpt = loaded[path] = load_checkpoint(path, arch=arch)
        source = ckpt.get("source") if isinstance(ckpt.get("source"), dict) else {}
        args = ckpt.get("args") if isinstance(ckpt.get("args"), dict) else {}
        sparsity = _number(args.get("sparsity")) or _number(args.get("sparsity_target"))
        stage = PRUNED if path.name == "pruned.pth" else FINETUNED if source.get("path") \
            else SPARSE if sparsity else BASELINE
        if stage in found:
            break
        found[stage] = folder
        came_from = source.get("path")
        if not isinstance(came_from, str) or len(came_from) > 4096:
            break
        folder = Path(came_from).parent
    return {name: found[name] for name in STAGES if name in found}


def build_report(run: str | Path, latency_repeats: int = 10,
                 device: str | torch.device = "cpu", arch: str | None = None) -> dict:
    """Gather the figures of a run folder: per stage accuracy, parameters, FLOPs, latency on
    ``device`` (batch 1 and 64), the per-layer channels kept, the gammas and the training curves.
    Bad input raises SlimmingError with one line naming the file (see the module docstring)."""
    run = Path(run)
    if not run.is_dir():
        raise SlimmingError(f"{run}: no such run folder (--run takes the --save folder of "
                            "slimming pipeline, train, prune or finetune)")
    stages: dict[str, dict] = {}
    models: dict[str, nn.Module] = {}
    report: dict = {"run": str(run), "stages": stages, "layers": [], "threshold": None,
                    "percent": None, "device": str(device)}
    loaded: dict[Path, dict] = {}
    folders = _stage_folders(run, arch, loaded)
    for name, folder in folders.items():
        path = _stage_checkpoint(folder)
        ckpt = loaded.get(path) or load_checkpoint(path, arch=arch)  # arch: your own code's network
        model = model_from_checkpoint(ckpt, path).eval()
        models[name] = model
        acc = _number(ckpt.get("best_acc", ckpt.get("acc")))
        if name == "pruned":
            done = folder / "eval.json"
            acc = _read_eval(done) if done.exists() else None
            report["threshold"] = _number(ckpt.get("threshold"))
            report["percent"] = _number(ckpt.get("percent"))
            report["budget"] = _latency_budget(ckpt.get("budget"))
            if ckpt.get("cfg_mask") is not None:
                report["layers"] = _layers(ckpt["cfg_mask"], model, path, ckpt.get("layer_names"))
        epochs = ckpt.get("epoch")
        if not isinstance(epochs, int) or isinstance(epochs, bool) or not 0 <= epochs <= MAX_EPOCH:
            epochs = None
        stages[name] = {"checkpoint": str(path), "acc": acc, "epochs": epochs, "cfg": model.cfg}
    if not stages:
        raise SlimmingError(f"{run}: holds no checkpoint (best.pth, last.pth or pruned.pth) and no "
                            "stage folder with one (baseline/, sparse/, pruned/, finetuned/)")
    timed = list(models.values())  # together, in turn: the stages' ratios hold on a busy machine
    size = input_size_of(timed[0])  # what it was trained at
    together = compare_stats([m.to(device) for m in timed], size, repeats=latency_repeats)
    for name, stats in zip(models, together):
        stages[name].update(stats)
    for m in timed:
        m.cpu()
    report["curves"], report["skipped_rows"] = {}, {}
    for name in TRAINED:
        if name not in folders:
            continue
        path = folders[name] / "metrics.jsonl"
        if path.exists() or path.is_symlink():
            rows, skipped = _read_metrics(path)
            report["curves"][name] = rows
            if skipped:
                report["skipped_rows"][name] = skipped
    sparse_rows = report["curves"].get(SPARSE)
    report["prune_epoch"] = (sparse_rows[-1]["epoch"] if sparse_rows
                             else stages.get(SPARSE, {}).get("epochs"))
    report["gammas"] = {name: torch.cat([bn.weight.detach().abs().flatten()
                                         for bn in prunable_factors(models[name])])
                        for name in (SPARSE, BASELINE)
                        if name in models and prunable_factors(models[name])}
    return report


def _latency_budget(budget) -> dict | None:
    """A pruned checkpoint's latency budget record (``LatencyBudget.as_dict``), checked for the
    fields the report prints; None for anything else."""
    b = LatencyBudget.from_dict(budget)
    return None if b is None else b.as_dict()


def _ratio(a, b) -> str:
    return f"{b / a:.3f}x" if a else "-"


def _timed(before: dict, after: dict, batch: int) -> str:
    """``after``'s latency over ``before``'s at ``batch``, from their rounds' ratios to the first
    stage timed (``compare_stats``), with the spread: the ratio of the two stages' ratios."""
    first = [1.0, 0.0]
    a, b = (s.get("latency_ratio", {}).get(batch, first if s.get("latency_ms", {}).get(batch) else None)
            for s in (before, after))
    if a is None or b is None or not a[0]:
        return "-"
    value = b[0] / a[0]
    return f"{value:.3f}x +- {value * math.hypot(a[1] / a[0], b[1] / b[0] if b[0] else 0):.3f}"


def below_cut(report: dict) -> str | None:
    """One line where the fine-tuned stage's accuracy is under the pruned one's right after the
    cut (the fine-tune lost what the cut kept, most often at too high a learning rate), else None."""
    stages = report["stages"]
    cut, tuned = (stages.get(name, {}).get("acc") for name in (PRUNED, FINETUNED))
    if cut is None or tuned is None or not tuned < cut:
        return None
    return (f"fine-tuning ended below the cut: its best {tuned:.2f}% against {cut:.2f}% right after the "
            "cut; its learning rate was likely too high for its length (slimming pipeline --finetune-lr, "
            "slimming finetune --lr)")


def write_report(report: dict, run: str | Path) -> list[Path]:
    """report.md, report.json and (with matplotlib) gammas.png, channels.png, curves.png, each
    written atomically (slimming.utils.files: a symlink planted at a target is replaced, not followed)."""
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
            pruned = stages.get("pruned")
            plots.training_curves(report["curves"], run / "curves.png",
                                  prune_epoch=report.get("prune_epoch") if pruned else None,
                                  pruned_acc=pruned["acc"] if pruned else None)
            pictures.append("curves.png")
        timed = [s for s in stages.values() if s["acc"] is not None and s["latency_ms"].get(1) is not None]
        if len(timed) >= 2:
            plots.accuracy_latency(stages, run / "latency.png")
            pictures.append("latency.png")
    md = [f"# Slimming report: {run}", ""]
    md += ["| stage | top-1 | parameters | FLOPs | latency b1 | latency b64 | cfg |",
           "|---|---|---|---|---|---|---|"]
    for name, s in stages.items():
        acc = "not measured" if s["acc"] is None else f"{s['acc']:.2f}%"
        lat = s["latency_ms"]
        md.append(f"| {name} | {acc} | {s['params'] / 1e6:.3f}M | {s['flops']:.3e} | "
                  f"{lat.get(1, float('nan')):.2f} ms | {lat.get(64, float('nan')):.2f} ms | "
                  f"`{describe_cfg(s['cfg'])}` |")
    if note := below_cut(report):
        md += ["", f"**Note**: {note}."]
    before = stages.get(SPARSE) or stages.get(BASELINE)
    after = stages.get("finetuned") or stages.get("pruned")
    if before and after and before is not after:
        md += ["", f"After / before: parameters {_ratio(before['params'], after['params'])}, "
               f"FLOPs {_ratio(before['flops'], after['flops'])}, latency batch 1 "
               f"{_timed(before, after, 1)}, batch 64 {_timed(before, after, 64)} "
               f"(on {report.get('device', 'cpu')}, the stages timed together, in turn: the median of "
               "the rounds' ratios, +- a 95% spread)."]
    b = report.get("budget") or {}
    if b.get("what") == "latency":
        md += ["", f"Latency budget asked at the cut: {b['target_ms']:.3g} ms ({b['asked']:g}"
               f"{' of the original' if b['unit'] == 'fraction' else ' ms'}, batch {b.get('batch')}, "
               f"{b['runtime']}); measured then: {b['ratio']:.3f} +- {b['ratio_spread']:.3f} of the "
               f"original ({b['ms']:.3g} +- {b['ms_spread']:.2g} ms against its {b['original_ms']:.3g} ms, "
               "interleaved)"
               + ("" if b["met"] else ": missed") + "."]
    if report["layers"]:
        thr = report["threshold"]
        md += ["", f"Pruned {report['percent'] if report['percent'] is not None else '-'} of "
               f"channels; |gamma| threshold {thr if thr is None else f'{thr:.4g}'}.", "",
               "| layer | channels before | after |", "|---|---|---|"]
        md += [f"| {n} | {b} | {a} |" for n, b, a in report["layers"]]
    for name, n in report.get("skipped_rows", {}).items():
        md += ["", f"{name}/metrics.jsonl: {n} row(s) skipped (not a JSON object with an integer "
               "epoch and finite test_acc and train_loss)."]
    md += [""]
    if pictures:
        md += [f"![{p[:-4]}]({p})" for p in pictures]
    else:
        md += [f"No pictures: {plots.MISSING}." if not plots.available() else "No pictures."]
    write_text(run / "report.md", "\n".join(md) + "\n")
    data = {k: v for k, v in report.items() if k != "gammas"}
    data["pictures"] = pictures
    data["below_cut"] = below_cut(report)
    write_text(run / "report.json", json.dumps(data, indent=1, default=str))
    return [run / "report.md", run / "report.json", *(run / p for p in pictures)]
