"""slimming sweep, slimming pipeline and slimming report."""

import json

import pytest

from slimming import plots
from slimming.cli import main
from slimming.sweep import parse_percents

TINY = "8,M,16,M,16,16,M,24,M,24"
DATA = ["--dataset", "synthetic", "--cpu", "--batch-size", "128"]


def test_parse_percents():
    assert parse_percents("0.1:0.9:0.1") == pytest.approx([0.1 * i for i in range(1, 10)])
    assert parse_percents("0.5,0.7") == [0.5, 0.7]
    for bad in ("0.1:1.0:0.1", "a,b", "0.5:0.1:-1", "1.2"):
        with pytest.raises(ValueError):
            parse_percents(bad)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("pipe") / "run"
    argv = ["pipeline", "--arch", "vgg", "--cfg", TINY, "--epochs", "2", "--finetune-epochs", "1",
            "--sparsity", "1e-2", "--percent", "0.5", "--baseline", "--repeats", "2", "--seed", "0",
            "--save", str(root), *DATA]
    assert main(argv) == 0
    return root, argv


def test_pipeline_stages_and_report(run):
    root, _ = run
    for stage in ("baseline", "sparse", "finetuned"):
        assert (root / stage / "last.pth").exists()
    assert (root / "pruned" / "pruned.pth").exists()
    report = json.loads((root / "report.json").read_text())
    stages = report["stages"]
    assert list(stages) == ["baseline", "sparse", "pruned", "finetuned"]
    assert stages["sparse"]["checkpoint"] == str(root / "sparse" / "best.pth")
    assert stages["finetuned"]["epochs"] == 1
    assert stages["pruned"]["params"] < stages["sparse"]["params"]
    assert stages["pruned"]["acc"] == json.loads((root / "pruned" / "eval.json").read_text())["acc"]
    assert len(report["layers"]) == 6 and report["layers"][0][0] == "feature.1"
    assert sum(b - a for _, b, a in report["layers"]) == 52  # half of the 104 channels
    md = (root / "report.md").read_text()
    assert "| finetuned |" in md and "After / before: parameters" in md
    if plots.available():
        assert set(report["pictures"]) == {"gammas.png", "channels.png", "curves.png"}
        assert all((root / p).stat().st_size > 1000 for p in report["pictures"])


def test_pipeline_rerun_skips_finished_stages(run, capsys):
    root, argv = run
    stamps = {p: p.stat().st_mtime_ns for p in root.rglob("*.pth")}
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("nothing to do") == 3 and "exists: skipping" in out
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*.pth")} == stamps


def test_report_without_matplotlib_is_text_only(run, monkeypatch, capsys, tmp_path):
    root, _ = run
    monkeypatch.setattr(plots, "available", lambda: False)
    for p in root.glob("*.png"):
        p.unlink()
    assert main(["report", "--run", str(root), "--repeats", "0"]) == 0
    assert "text only" in capsys.readouterr().out
    assert "matplotlib is not installed" in (root / "report.md").read_text()
    assert not list(root.glob("*.png"))
    assert main(["report", "--run", str(tmp_path)]) == 2  # an empty folder: one clear line
    assert "holds no stage" in capsys.readouterr().err


def test_sweep_table(run, tmp_path, capsys):
    root, _ = run
    assert main(["sweep", "--checkpoint", str(root / "sparse" / "best.pth"), "--percents",
                 "0.0,0.3,0.6,0.9", "--save", str(tmp_path / "sw"), *DATA]) == 0
    rows = json.loads((tmp_path / "sw" / "sweep.json").read_text())
    assert [r["percent"] for r in rows] == [0.0, 0.3, 0.6, 0.9]
    kept = [r["params_kept"] for r in rows]
    assert kept[0] == 1.0 and kept == sorted(kept, reverse=True)
    sparse_acc = json.loads((root / "report.json").read_text())["stages"]["sparse"]["acc"]
    assert rows[0]["acc"] == pytest.approx(sparse_acc)  # percent 0 is the unpruned network
    assert (tmp_path / "sw" / "sweep.csv").read_text().startswith("percent,threshold,params")
    assert (tmp_path / "sw" / "sweep.png").exists() == plots.available()
