"""The report's and the sweep's pictures, checked on their figure objects (no pixels)."""

import pytest
import torch

from slimming.tools import plots

pytest.importorskip("matplotlib")

from matplotlib.ticker import MaxNLocator  # noqa: E402


def _titled(fig) -> bool:
    return bool(fig._suptitle and fig._suptitle.get_text()) or all(ax.get_title() for ax in fig.axes)


def _int_locator(axis) -> bool:
    loc = axis.get_major_locator()
    return isinstance(loc, MaxNLocator) and loc._integer


def _rows(n, start=1, acc=50.0):
    return [{"epoch": e, "test_acc": acc + e, "train_loss": 2.0 / e} for e in range(start, start + n)]


def test_training_curves_one_epoch_axis_with_the_prune_marked():
    curves = {"baseline": _rows(4), "sparse": _rows(4), "finetuned": _rows(2)}
    fig = plots.training_curves_figure(curves, prune_epoch=4, pruned_acc=20.0)
    acc, loss = fig.axes
    assert fig._suptitle.get_text() and acc.get_title() and loss.get_title()
    assert _int_locator(acc.xaxis) and _int_locator(loss.xaxis)
    lines = {line.get_label(): line for line in acc.get_lines()}
    # baseline and sparse over 1..4, the fine-tune continues at 5, 6
    assert list(lines["baseline"].get_xdata()) == [1, 2, 3, 4]
    assert list(lines["sparse"].get_xdata()) == [1, 2, 3, 4]
    assert list(lines["finetuned"].get_xdata()) == [5, 6]
    prune_line = lines["pruned after epoch 4"]
    assert list(prune_line.get_xdata()) == [4, 4] and prune_line.get_linestyle() == "--"
    marker = next(v for k, v in lines.items() if k.startswith("right after pruning"))
    assert list(marker.get_xdata()) == [4] and list(marker.get_ydata()) == [20.0]
    assert "pruned after epoch 4" in [line.get_label() for line in loss.get_lines()]


def test_training_curves_prune_epoch_defaults_to_the_sparse_runs_last():
    fig = plots.training_curves_figure({"sparse": _rows(3), "finetuned": _rows(2)})
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    assert list(lines["finetuned"].get_xdata()) == [4, 5]
    assert not any(k.startswith("right after pruning") for k in lines)  # no eval.json: no marker


def test_training_curves_without_a_prune():
    fig = plots.training_curves_figure({"baseline": _rows(3)})
    labels = [line.get_label() for line in fig.axes[0].get_lines()]
    assert labels == ["baseline"] and _titled(fig)


def test_histogram_and_channels_have_titles_and_integer_counts():
    fig = plots.gamma_histogram_figure({"sparse": torch.rand(50), "baseline": torch.rand(50) + 0.5},
                                       threshold=0.3)
    (ax,) = fig.axes
    assert ax.get_title() and _int_locator(ax.yaxis) and ax.get_xscale() == "log"
    fig = plots.channels_kept_figure([("feature.1", 8, 3), ("feature.4", 16, 9)])
    (ax,) = fig.axes
    assert "12 of 24" in ax.get_title() and _int_locator(ax.yaxis)


def _sweep_rows(percents):
    rows = [{"percent": 0.0, "threshold": None, "params": 1000, "params_kept": 1.0, "flops": 10_000,
             "flops_kept": 1.0, "acc": 90.0, "loss": 0.3, "reference": True}]
    for p in percents:
        kept = (1 - p) ** 2
        rows.append({"percent": p, "threshold": p / 10, "params": int(1000 * kept),
                     "params_kept": kept, "flops": int(10_000 * kept), "flops_kept": kept,
                     "acc": max(10.0, 90.0 - 100 * p ** 3), "loss": 1.0, "reference": False})
    return rows


def _label_boxes(fig, ax):
    renderer = fig.canvas.get_renderer()
    return [t.get_window_extent(renderer) for t in ax.texts]


def test_sweep_reference_point_and_dashed_line():
    fig = plots.sweep_figure(_sweep_rows([0.2, 0.5, 0.8]))
    assert fig._suptitle.get_text()
    for ax in fig.axes:
        assert ax.get_title()
        star = [line for line in ax.get_lines() if line.get_marker() == "*"]
        assert len(star) == 1 and list(star[0].get_xdata()) == [100.0]
        assert list(star[0].get_ydata()) == [90.0]
        dashed = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
        assert len(dashed) == 1 and list(dashed[0].get_ydata()) == [90.0, 90.0]
        # sparse points: every one labelled, the reference as "unpruned"
        assert [t.get_text() for t in ax.texts] == ["unpruned", "0.2", "0.5", "0.8"]


@pytest.mark.parametrize("percents", [
    [round(0.01 * i, 2) for i in range(1, 100)],  # the 100-point cap, densely packed
    [0.9 + 0.001 * i for i in range(1, 60)],      # all bunched at the low-kept end
])
def test_sweep_labels_never_overlap(percents):
    fig = plots.sweep_figure(_sweep_rows(percents))
    for ax in fig.axes:
        boxes = _label_boxes(fig, ax)
        assert 2 <= len(boxes) < len(percents)  # some labelled, the crowded ones left out
        assert ax.texts[0].get_text() == "unpruned"
        for i, a in enumerate(boxes):
            for b in boxes[i + 1:]:
                assert not a.overlaps(b)


def test_sweep_without_reference_row():
    rows = [r for r in _sweep_rows([0.2, 0.5]) if not r["reference"]]
    fig = plots.sweep_figure(rows)
    assert not any(line.get_marker() == "*" for line in fig.axes[0].get_lines())


def test_pictures_are_written_atomically_not_through_a_symlink(tmp_path):
    elsewhere = tmp_path / "elsewhere.png"
    elsewhere.write_bytes(b"keep")
    target = tmp_path / "out" / "sweep.png"
    target.parent.mkdir()
    target.symlink_to(elsewhere)
    plots.sweep_curves(_sweep_rows([0.5]), target)
    assert not target.is_symlink() and target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert elsewhere.read_bytes() == b"keep"
    assert sorted(p.name for p in target.parent.iterdir()) == ["sweep.png"]  # no temporary left


def test_no_pyplot_backend_switch():
    """The figures do not go through pyplot, so a notebook's inline backend is left alone."""
    import matplotlib

    before = matplotlib.get_backend()
    plots.png_bytes(plots.channels_kept_figure([("a", 2, 1)]))
    assert matplotlib.get_backend() == before
