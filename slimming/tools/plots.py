"""PNG figures for reports and sweeps. matplotlib is optional (the ``[plot]`` extra):
``available()`` says whether it is installed.

Each picture has a ``*_figure`` function that builds a ``matplotlib.figure.Figure`` (no pyplot:
no global state, no backend switched under a notebook that shows plots inline), and a function
of the old name that renders it to PNG bytes and writes them atomically through
``slimming.utils.files.write_bytes`` (never through a symlink planted at the target).
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Mapping, Sequence

import torch

from ..utils.files import write_bytes

MISSING = "matplotlib is not installed: pip install matplotlib (the plot extra) for the pictures"
DPI = 110
# The stage colours, the same in every picture.
COLORS = {"baseline": "tab:gray", "sparse": "tab:blue", "pruned": "tab:red", "finetuned": "tab:green"}


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)  # a renderer to measure text with, and PNG output
    return fig


def _integer_ticks(axis) -> None:
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def png_bytes(fig) -> bytes:
    """The figure as PNG bytes (the Agg renderer; works without pyplot)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def save(fig, path: str | os.PathLike) -> None:
    """Write ``fig`` as a PNG to ``path`` atomically."""
    write_bytes(path, png_bytes(fig))


# ---------------------------------------------------------------------------------------------
# |gamma| histogram


def gamma_histogram_figure(gammas: Mapping[str, torch.Tensor], threshold: float | None):
    """Histogram of |gamma| (log x axis) per named model, with the pruning threshold marked."""
    fig = _figure(7, 4)
    ax = fig.subplots()
    values = {name: g.detach().abs().flatten().float().clamp_min(1e-8) for name, g in gammas.items()
              if g.numel()}
    if values:
        everything = torch.cat(list(values.values()))
        lo, hi = everything.min().log10().item(), everything.max().log10().item()
        bins = torch.logspace(lo, max(hi, lo) + 1e-6, 60).numpy()
        for name, g in values.items():
            ax.hist(g.numpy(), bins=bins, alpha=0.6, label=name, color=COLORS.get(name))
        ax.set_xscale("log")
    if threshold is not None and math.isfinite(threshold) and threshold > 0:
        ax.axvline(threshold, color="red", linestyle="--", label=f"threshold {threshold:.3g}")
    ax.set_xlabel("|gamma| (BN scale factor), log scale")
    ax.set_ylabel("channels")
    _integer_ticks(ax.yaxis)
    ax.set_title("BatchNorm |gamma| of prunable layers (left of the threshold: pruned)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    fig.tight_layout()
    return fig


def gamma_histogram(gammas: Mapping[str, torch.Tensor], threshold: float | None,
                    path: str | os.PathLike) -> None:
    save(gamma_histogram_figure(gammas, threshold), path)


# ---------------------------------------------------------------------------------------------
# channels kept per layer


def channels_kept_figure(layers: Sequence[tuple[str, int, int]]):
    """Bar chart of channels before and after pruning, per BN layer."""
    fig = _figure(max(6, 0.35 * len(layers) + 2), 4)
    ax = fig.subplots()
    xs = list(range(len(layers)))
    ax.bar(xs, [b for _, b, _ in layers], color="lightgray", label="before")
    ax.bar(xs, [a for _, _, a in layers], color=COLORS["sparse"], label="kept")
    ax.set_xticks(xs, [n for n, _, _ in layers], rotation=90, fontsize=7)
    ax.set_ylabel("channels")
    _integer_ticks(ax.yaxis)
    kept, before = sum(a for _, _, a in layers), sum(b for _, b, _ in layers)
    share = f" ({kept} of {before}, {100 * kept / before:.0f}%)" if before else ""
    ax.set_title(f"Channels kept per BatchNorm layer{share}")
    ax.legend()
    fig.tight_layout()
    return fig


def channels_kept(layers: Sequence[tuple[str, int, int]], path: str | os.PathLike) -> None:
    save(channels_kept_figure(layers), path)


def accuracy_latency_figure(stages: Mapping[str, Mapping], batch: int = 1):
    """Each stage's test accuracy against its measured latency at ``batch`` (a point per stage
    with both): what a user chooses a slimmed network by."""
    fig = _figure(6, 4.5)
    ax = fig.subplots()
    for name, s in stages.items():
        ms = s.get("latency_ms", {}).get(batch)
        if s.get("acc") is not None and ms is not None:
            ax.plot([ms], [s["acc"]], marker="o", markersize=8, linestyle="none", color=COLORS.get(name),
                    label=f"{name}: {ms:.3g} ms, {s['acc']:.2f}%")
    ax.set_xlabel(f"latency at batch {batch} (ms, measured)")
    ax.set_ylabel("test top-1 (%)")
    ax.set_title("Accuracy against measured latency")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def accuracy_latency(stages: Mapping[str, Mapping], path: str | os.PathLike, batch: int = 1) -> None:
    save(accuracy_latency_figure(stages, batch), path)


# ---------------------------------------------------------------------------------------------
# training curves


def training_curves_figure(curves: Mapping[str, Sequence[Mapping]], prune_epoch: int | None = None,
                           pruned_acc: float | None = None):
    """Test accuracy and training loss of each stage on one continuous epoch axis.

    ``curves`` maps a stage (``baseline``, ``sparse``, ``finetuned``) to its metrics rows
    (``epoch``, ``test_acc``, ``train_loss``). Baseline and sparse run over their own epochs
    1..E; the fine-tune continues after ``prune_epoch`` (the sparse run's last epoch; by default
    the largest epoch of the sparse rows), where a vertical line marks the prune and, given
    ``pruned_acc``, a marker shows the accuracy right after pruning, before any fine-tuning.
    """
    fig = _figure(11, 4.2)
    acc, loss = fig.subplots(1, 2)
    if prune_epoch is None and curves.get("sparse"):
        prune_epoch = max(r["epoch"] for r in curves["sparse"])
    for name, rows in curves.items():
        if not rows:
            continue
        shift = prune_epoch if name == "finetuned" and prune_epoch is not None else 0
        epochs = [shift + r["epoch"] for r in rows]
        style = {"marker": "o", "markersize": 3, "label": name, "color": COLORS.get(name)}
        if name == "finetuned" and prune_epoch is not None and pruned_acc is not None:
            # Join the fine-tune to the point it starts from: the pruned network's accuracy.
            acc.plot([prune_epoch, epochs[0]], [pruned_acc, rows[0]["test_acc"]],
                     color=style["color"], linestyle=":", linewidth=1)
        acc.plot(epochs, [r["test_acc"] for r in rows], **style)
        loss.plot(epochs, [r["train_loss"] for r in rows], **style)
    if prune_epoch is not None:
        for ax in (acc, loss):
            ax.axvline(prune_epoch, color=COLORS["pruned"], linestyle="--", linewidth=1,
                       label=f"pruned after epoch {prune_epoch}")
    if prune_epoch is not None and pruned_acc is not None:
        acc.plot([prune_epoch], [pruned_acc], marker="X", markersize=10, linestyle="none",
                 color=COLORS["pruned"], label=f"right after pruning: {pruned_acc:.1f}%")
    for ax, what in ((acc, "test top-1 (%)"), (loss, "training loss")):
        ax.set_xlabel("epoch (fine-tune continues after the prune)" if prune_epoch is not None
                      and curves.get("finetuned") else "epoch")
        ax.set_ylabel(what)
        _integer_ticks(ax.xaxis)
        ax.grid(alpha=0.3)
    acc.set_title("Test accuracy")
    loss.set_title("Training loss")
    if acc.get_legend_handles_labels()[0]:
        acc.legend(fontsize=8)
    fig.suptitle("Training curves: sparsity training, prune, fine-tune")
    fig.tight_layout()
    return fig


def training_curves(curves: Mapping[str, Sequence[Mapping]], path: str | os.PathLike,
                    prune_epoch: int | None = None, pruned_acc: float | None = None) -> None:
    save(training_curves_figure(curves, prune_epoch, pruned_acc), path)


# ---------------------------------------------------------------------------------------------
# prune sweep

LABEL_FONTSIZE = 7
LABEL_OFFSET = (3, 3)  # points, up and to the right of the marker


def _label_overlaps(box, placed, pad: float) -> bool:
    x0, y0, x1, y1 = box
    return any(x0 < b[2] + pad and b[0] < x1 + pad and y0 < b[3] + pad and b[1] < y1 + pad
               for b in placed)


def _label_points(fig, ax, points: Sequence[tuple]) -> None:
    """Annotate the points ``(x, y, text[, offset in points, horizontal alignment])`` whose
    label would not overlap an already placed one.

    Why this rule: a sweep's points bunch up where the fraction kept changes little between
    percents (and accuracies sit on a plateau near chance at high percents), so neither "every
    k-th point" nor alternating offsets keeps labels apart for every sweep. Instead each label's
    box is measured in display space (after the layout is final) and a label that would touch
    one already placed is left out; the marker stays, and the table (sweep.md) has every row.
    """
    renderer = fig.canvas.get_renderer()
    placed: list[tuple[float, float, float, float]] = []
    pad = 2.0  # pixels between labels
    for x, y, text, *where in points:
        offset, ha = where or (LABEL_OFFSET, "left")
        note = ax.annotate(text, (x, y), fontsize=LABEL_FONTSIZE, textcoords="offset points",
                           xytext=offset, ha=ha)
        bb = note.get_window_extent(renderer)
        box = (bb.x0, bb.y0, bb.x1, bb.y1)
        if _label_overlaps(box, placed, pad):
            note.remove()
        else:
            placed.append(box)


def sweep_figure(rows: Sequence[Mapping]):
    """Accuracy right after pruning against the fraction of parameters and of FLOPs kept (and
    of the measured latency, for a latency sweep).

    A row with ``"reference": True`` is the unpruned network: drawn as a star at 100% kept with
    a dashed horizontal line at its accuracy, so the cost of each percent reads off directly.
    """
    kinds = [("params_kept", "parameters"), ("flops_kept", "FLOPs")]
    if all("latency_kept" in r for r in rows if r.get("acc") is not None):  # a latency sweep
        kinds.append(("latency_kept", "measured latency"))
    fig = _figure(5.5 * len(kinds), 4.5)
    axes = fig.subplots(1, len(kinds), sharey=True)
    reference = next((r for r in rows if r.get("reference")), None)
    points = [r for r in rows if not r.get("reference") and r.get("acc") is not None]  # not the missed
    for ax, (key, label) in zip(axes, kinds):
        ax.plot([100 * r[key] for r in points], [r["acc"] for r in points], marker="o",
                markersize=4, color=COLORS["pruned"], label="pruned, no fine-tune")
        if reference is not None:
            ax.axhline(reference["acc"], color="black", linestyle="--", linewidth=1,
                       label=f"unpruned: {reference['acc']:.2f}%")
            ax.plot([100 * reference[key]], [reference["acc"]], marker="*", markersize=12,
                    linestyle="none", color="black")
        ax.set_xlabel(f"{label} kept (%)")
        ax.set_title(f"Accuracy against {label} kept")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test top-1 without fine-tuning (%)")
    axes[0].legend(fontsize=8, loc="lower right")
    fig.suptitle("Prune sweep (labels: fraction of channels removed)")
    fig.tight_layout()
    for ax, (key, _) in zip(axes, kinds):
        # The reference's label goes below and to the left of its star, inside the axes.
        labels = ([(100 * reference[key], reference["acc"], "unpruned", (-4, -11), "right")]
                  if reference else [])
        labels += [(100 * r[key], r["acc"], f"{r['percent']:g}") for r in points]
        _label_points(fig, ax, labels)
    return fig


def sweep_curves(rows: Sequence[Mapping], path: str | os.PathLike) -> None:
    save(sweep_figure(rows), path)
