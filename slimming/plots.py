"""PNG figures for reports and sweeps. matplotlib is optional (the ``[plot]`` extra):
``available()`` says whether it is installed; every function writes one PNG file."""

from __future__ import annotations

from pathlib import Path

import torch

MISSING = "matplotlib is not installed: pip install -e \".[plot]\" for the pictures"


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def gamma_histogram(gammas: dict[str, torch.Tensor], threshold: float | None, path: Path) -> None:
    """Histogram of |gamma| (log x axis) per named model, with the pruning threshold marked."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    everything = torch.cat([g.abs().flatten() for g in gammas.values()]).clamp_min(1e-8)
    bins = torch.logspace(everything.min().log10().item(), everything.max().log10().item() + 1e-6, 60)
    for name, g in gammas.items():
        ax.hist(g.abs().clamp_min(1e-8).numpy(), bins=bins.numpy(), alpha=0.6, label=name)
    if threshold:
        ax.axvline(threshold, color="red", linestyle="--", label=f"threshold {threshold:.3g}")
    ax.set_xscale("log")
    ax.set_xlabel("|gamma| (BN scale factor)")
    ax.set_ylabel("channels")
    ax.set_title("BatchNorm |gamma| of prunable layers")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def channels_kept(layers: list[tuple[str, int, int]], path: Path) -> None:
    """Bar chart of channels before and after pruning, per BN layer."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6, 0.35 * len(layers) + 2), 4))
    xs = range(len(layers))
    ax.bar(xs, [b for _, b, _ in layers], color="lightgray", label="before")
    ax.bar(xs, [a for _, _, a in layers], color="tab:blue", label="kept")
    ax.set_xticks(list(xs), [n for n, _, _ in layers], rotation=90, fontsize=7)
    ax.set_ylabel("channels")
    ax.set_title("Channels kept per layer")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def training_curves(curves: dict[str, list[dict]], path: Path) -> None:
    """Test accuracy and training loss per epoch for each stage's metrics log."""
    plt = _pyplot()
    fig, (acc, loss) = plt.subplots(1, 2, figsize=(10, 4))
    for name, rows in curves.items():
        epochs = [r["epoch"] for r in rows]
        acc.plot(epochs, [r["test_acc"] for r in rows], marker="o", label=name)
        loss.plot(epochs, [r["train_loss"] for r in rows], marker="o", label=name)
    acc.set_xlabel("epoch")
    acc.set_ylabel("test top-1 (%)")
    loss.set_xlabel("epoch")
    loss.set_ylabel("training loss")
    acc.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def sweep_curves(rows: list[dict], path: Path) -> None:
    """Accuracy right after pruning against the fraction of parameters and of FLOPs kept."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, key, label in zip(axes, ("params_kept", "flops_kept"), ("parameters", "FLOPs")):
        ax.plot([100 * r[key] for r in rows], [r["acc"] for r in rows], marker="o")
        for r in rows:
            ax.annotate(f"{r['percent']:g}", (100 * r[key], r["acc"]), fontsize=7,
                        textcoords="offset points", xytext=(3, 3))
        ax.set_xlabel(f"{label} kept (%)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test top-1 without fine-tuning (%)")
    fig.suptitle("Prune sweep (labels: percent of channels removed)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
