"""slimming sweep, slimming pipeline and slimming report."""

import json
import math
import re
import shutil
import time
from pathlib import Path

import pytest
import torch
from conftest import TINY_VGG, randomize_bn

import slimming
from slimming import models
from slimming.cli import main
from slimming.errors import SlimmingError
from slimming.io.checkpoint import checkpoint_dict, load_checkpoint, save_checkpoint
from slimming.pruning.records import LatencyBudget, LatencyRound
from slimming.tools import plots
from slimming.tools.report import MAX_EVAL_BYTES, MAX_METRICS_BYTES, build_report, write_report
from slimming.tools.sweep import MAX_POINTS, parse_percents, sweep, write_sweep

TINY = "8,M,16,M,16,16,M,24,M,24"
DATA = ["--dataset", "synthetic", "--cpu", "--batch-size", "128"]


def test_parse_percents():
    assert parse_percents("0.1:0.9:0.1") == pytest.approx([0.1 * i for i in range(1, 10)])
    assert parse_percents("0.5,0.7") == [0.5, 0.7]
    for bad in ("0.1:1.0:0.1", "a,b", "0.5:0.1:-1", "1.2"):
        with pytest.raises(ValueError):  # SlimmingError is a ValueError
            parse_percents(bad)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("pipe") / "run"
    argv = ["pipeline", "--arch", "vgg", "--cfg", TINY, "--epochs", "2", "--finetune-epochs", "1",
            "--sparsity", "1e-2", "--percent", "0.5", "--baseline", "--repeats", "2", "--seed", "0",
            "--save", str(root), *DATA]
    assert main(argv) == 0
    return root, argv


@pytest.mark.slow
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
        assert set(report["pictures"]) == {"gammas.png", "channels.png", "curves.png", "latency.png"}
        assert all((root / p).stat().st_size > 1000 for p in report["pictures"])


@pytest.mark.slow
def test_pipeline_rerun_skips_finished_stages(run, capsys):
    root, argv = run
    stamps = {p: p.stat().st_mtime_ns for p in root.rglob("*.pth")}
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("nothing to do") == 3 and "exists: skipping" in out
    assert re.findall(r"^== \[(\d)/5\] (.+) ==$", out, re.M) == [  # each stage, numbered
        ("1", "baseline (no sparsity)"), ("2", "sparsity training"), ("3", "prune"), ("4", "fine-tune"),
        ("5", "report")]
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*.pth")} == stamps


@pytest.mark.slow
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
    assert "holds no checkpoint" in capsys.readouterr().err


@pytest.mark.slow
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


# ---------------------------------------------------------------------------------------------
# A run folder built by hand (no training), for what the report reads and writes.



def _metrics(epochs, acc=50.0):
    return "".join(json.dumps({"epoch": e, "lr": 0.1, "train_loss": 2.0 / e, "train_acc": acc,
                               "test_loss": 1.0, "test_acc": acc + e, "gamma_lt_1e-2": 0.1,
                               "amp_skipped": 0, "seconds": 1.0}) + "\n" for e in epochs)


@pytest.fixture(scope="module")
def made_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("made") / "run"
    torch.manual_seed(0)
    model = models.build("vgg", cfg=TINY_VGG)
    randomize_bn(model, torch.Generator().manual_seed(0), zero_frac=0.5)
    save_checkpoint(checkpoint_dict(model, epoch=3, acc=60.0, best_acc=61.0), root / "sparse" / "best.pth")
    (root / "sparse" / "metrics.jsonl").write_text(_metrics([1, 2, 3]))
    result = slimming.prune(model, percent=0.5)
    save_checkpoint(checkpoint_dict(result.model, cfg_mask=result.cfg_mask, threshold=result.threshold,
                                    percent=0.5), root / "pruned" / "pruned.pth")
    (root / "pruned" / "eval.json").write_text(json.dumps({"acc": 30.0, "loss": 2.0, "count": 512}))
    save_checkpoint(checkpoint_dict(result.model, epoch=2, acc=55.0, best_acc=55.0,
                                    cfg_mask=result.cfg_mask), root / "finetuned" / "last.pth")
    (root / "finetuned" / "metrics.jsonl").write_text(_metrics([1, 2], acc=40.0))
    return root


@pytest.fixture
def fresh_run(made_run, tmp_path):
    return Path(shutil.copytree(made_run, tmp_path / "run"))


@pytest.mark.parametrize("after_cut", [30.0, 70.0])
def test_a_fine_tune_below_the_cut_is_flagged(fresh_run, capsys, after_cut):
    """The fine-tuned stage's best is 55%: under an accuracy of 70% right after the cut the
    report says the fine-tune lost what the cut kept (in report.md, report.json and on stderr)."""
    (fresh_run / "pruned" / "eval.json").write_text(json.dumps({"acc": after_cut, "loss": 2.0, "count": 512}))
    assert main(["report", "--run", str(fresh_run), "--repeats", "0", "--cpu"]) == 0
    below = after_cut > 55.0
    err = capsys.readouterr().err
    assert ("fine-tuning ended below the cut: its best 55.00% against 70.00%" in err) == below
    assert ("**Note**: fine-tuning ended below the cut" in (fresh_run / "report.md").read_text()) == below
    data = json.loads((fresh_run / "report.json").read_text())
    assert (data["below_cut"] is not None) == below


def test_made_run_reports(fresh_run):
    report = build_report(fresh_run, latency_repeats=0)
    assert list(report["stages"]) == ["sparse", "pruned", "finetuned"]
    assert report["stages"]["pruned"]["acc"] == 30.0 and report["prune_epoch"] == 3
    assert [r["epoch"] for r in report["curves"]["sparse"]] == [1, 2, 3]
    assert report["skipped_rows"] == {} and len(report["layers"]) == 6
    written = write_report(report, fresh_run)
    assert written[:2] == [fresh_run / "report.md", fresh_run / "report.json"]


def test_report_replaces_planted_symlinks(fresh_run, tmp_path):
    """report.md (and every other output) is replaced by a new file, never written through."""
    outside = tmp_path / "outside.txt"
    outside.write_text("precious")
    names = ["report.md", "report.json"] + (["curves.png", "gammas.png"] if plots.available() else [])
    for name in names:
        (fresh_run / name).symlink_to(outside)
    written = write_report(build_report(fresh_run, latency_repeats=0), fresh_run)
    assert outside.read_text() == "precious"
    for name in names:
        assert not (fresh_run / name).is_symlink() and fresh_run / name in written
    assert (fresh_run / "report.md").read_text().startswith("# Slimming report")
    assert not [p for p in fresh_run.iterdir() if ".tmp" in p.name]  # no temporary left


def _write(rel, data):
    def mutate(root):
        path = root / rel
        if path.is_dir():
            shutil.rmtree(path)
        path.unlink(missing_ok=True)
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return mutate


def _big(rel, size):
    def mutate(root):
        with open(root / rel, "r+b") as f:
            f.truncate(size)  # sparse: no disk spent
    return mutate


def _as_folder(rel):
    def mutate(root):
        (root / rel).unlink()
        (root / rel).mkdir()
    return mutate


def _masks(change):
    def mutate(root):
        path = root / "pruned" / "pruned.pth"
        ckpt = load_checkpoint(path)
        ckpt.pop("checksum", None)
        ckpt["cfg_mask"] = change(ckpt["cfg_mask"])
        save_checkpoint(ckpt, path)
    return mutate


def _flip_first(masks):
    m = masks[0].clone()
    m[int((~m).nonzero()[0]) if (~m).any() else 0] ^= True
    return [m, *masks[1:]]


EVAL, PRUNED, SPARSE_LOG = "pruned/eval.json", "pruned/pruned.pth", "sparse/metrics.jsonl"

# (case, how the folder is spoiled, the file the one-line error must name, a word it must hold)
HOSTILE = [
    ("eval not JSON", _write(EVAL, "{acc: 1"), "eval.json", "JSON"),
    ("eval empty", _write(EVAL, ""), "eval.json", "JSON"),
    ("eval not UTF-8", _write(EVAL, b'\xff\xfe{"acc": 1}'), "eval.json", "JSON"),
    ("eval a list", _write(EVAL, "[1, 2]"), "eval.json", "object"),
    ("eval deeply nested", _write(EVAL, "[" * 200_000), "eval.json", "JSON"),
    ("eval no acc", _write(EVAL, '{"loss": 1}'), "eval.json", "acc"),
    ("eval acc a string", _write(EVAL, '{"acc": "high"}'), "eval.json", "acc"),
    ("eval acc true", _write(EVAL, '{"acc": true}'), "eval.json", "acc"),
    ("eval acc NaN", _write(EVAL, '{"acc": NaN}'), "eval.json", "acc"),
    ("eval acc Infinity", _write(EVAL, '{"acc": -Infinity}'), "eval.json", "acc"),
    ("eval acc 1e400", _write(EVAL, '{"acc": 1e400}'), "eval.json", "acc"),
    ("eval acc huge int", _write(EVAL, '{"acc": 1' + "0" * 400 + "}"), "eval.json", "acc"),
    ("eval acc over 100", _write(EVAL, '{"acc": 150}'), "eval.json", "acc"),
    ("eval over 1 MB", _big(EVAL, MAX_EVAL_BYTES + 1), "eval.json", "bytes"),
    ("eval a folder", _as_folder(EVAL), "eval.json", "regular file"),
    ("metrics over the bound", _big(SPARSE_LOG, MAX_METRICS_BYTES + 1), "metrics.jsonl", "bytes"),
    ("metrics a folder", _as_folder(SPARSE_LOG), "metrics.jsonl", "regular file"),
    ("cfg_mask a tensor", _masks(lambda m: m[0]), "pruned.pth", "cfg_mask"),
    ("cfg_mask a string", _masks(lambda m: "all"), "pruned.pth", "cfg_mask"),
    ("cfg_mask int tensors", _masks(lambda m: [x.long() for x in m]), "pruned.pth", "cfg_mask"),
    ("cfg_mask 2-d", _masks(lambda m: [x[None] for x in m]), "pruned.pth", "cfg_mask"),
    ("cfg_mask a string inside", _masks(lambda m: [*m[:-1], "x"]), "pruned.pth", "cfg_mask"),
    ("cfg_mask one layer short", _masks(lambda m: m[:-1]), "pruned.pth", "cfg_mask"),
    ("cfg_mask one layer more", _masks(lambda m: [*m, m[-1]]), "pruned.pth", "cfg_mask"),
    ("cfg_mask empty", _masks(lambda m: []), "pruned.pth", "cfg_mask"),
    ("cfg_mask wrong kept count", _masks(_flip_first), "pruned.pth", "cfg_mask"),
]


@pytest.mark.parametrize("case, spoil, names, word", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_run_folder_is_one_line(fresh_run, capsys, case, spoil, names, word):
    spoil(fresh_run)
    with pytest.raises(SlimmingError, match=word) as e:
        build_report(fresh_run, latency_repeats=0)
    assert names in str(e.value) and "\n" not in str(e.value)
    assert main(["report", "--run", str(fresh_run), "--repeats", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and names in err and "Traceback" not in err
    assert not (fresh_run / "report.md").exists()  # nothing half-written


def test_oversized_metrics_is_refused_without_reading_it(fresh_run, monkeypatch):
    _big(SPARSE_LOG, 50 * 2**30)(fresh_run)  # 50 GiB, sparse
    real_open = open

    def no_open(path, *a, **k):
        assert not str(path).endswith("metrics.jsonl"), "read a file it should have refused"
        return real_open(path, *a, **k)

    monkeypatch.setattr("builtins.open", no_open)
    with pytest.raises(SlimmingError, match="metrics.jsonl"):
        build_report(fresh_run, latency_repeats=0)


# (case, a metrics line the report must skip)
BAD_ROWS = [
    ("test_acc a string", '{"epoch": 4, "test_acc": "90", "train_loss": 0.1}'),
    ("test_acc NaN", '{"epoch": 4, "test_acc": NaN, "train_loss": 0.1}'),
    ("train_loss Infinity", '{"epoch": 4, "test_acc": 90, "train_loss": Infinity}'),
    ("train_loss missing", '{"epoch": 4, "test_acc": 90}'),
    ("test_acc a huge int", '{"epoch": 4, "test_acc": 1' + "0" * 400 + ', "train_loss": 0.1}'),
    ("epoch missing", '{"test_acc": 90, "train_loss": 0.1}'),
    ("epoch negative", '{"epoch": -1, "test_acc": 90, "train_loss": 0.1}'),
    ("epoch huge", '{"epoch": 1000000000000000000000000000000, "test_acc": 90, "train_loss": 0.1}'),
    ("epoch past the int digit limit", '{"epoch": 1' + "0" * 5000 + ', "test_acc": 9, "train_loss": 1}'),
    ("epoch a float", '{"epoch": 4.0, "test_acc": 90, "train_loss": 0.1}'),
    ("epoch a string", '{"epoch": "4", "test_acc": 90, "train_loss": 0.1}'),
    ("epoch true", '{"epoch": true, "test_acc": 90, "train_loss": 0.1}'),
    ("a list", '[4, 90, 0.1]'),
    ("a number", "4"),
    ("null", "null"),
    ("not JSON", '{"epoch": 4, "test_acc": 90,'),
    ("deeply nested", "[" * 100_000),
    ("not UTF-8", b'{"epoch": 4, "test_acc": 90, "train_loss": 0.1, "x": "\xff\xfe"}'),
]


@pytest.mark.parametrize("case, line", BAD_ROWS, ids=[b[0] for b in BAD_ROWS])
def test_bad_metrics_rows_are_skipped(fresh_run, monkeypatch, case, line):
    monkeypatch.setattr(plots, "available", lambda: False)  # text only: faster
    good = _metrics([1, 2, 3]).encode()
    bad = line if isinstance(line, bytes) else line.encode()
    (fresh_run / SPARSE_LOG).write_bytes(good[:good.index(b"\n") + 1] + bad + b"\n"
                                         + good[good.index(b"\n") + 1:])
    report = build_report(fresh_run, latency_repeats=0)
    rows = report["curves"]["sparse"]
    assert [r["epoch"] for r in rows] == [1, 2, 3] and report["skipped_rows"] == {"sparse": 1}
    assert all(math.isfinite(r["test_acc"]) and math.isfinite(r["train_loss"]) for r in rows)
    write_report(report, fresh_run)
    assert "sparse/metrics.jsonl: 1 row(s) skipped" in (fresh_run / "report.md").read_text()
    json.loads((fresh_run / "report.json").read_text())  # still strict JSON


def test_metrics_rows_repeated_epoch_keeps_the_later_and_drops_unknown_keys(fresh_run):
    text = _metrics([1, 2]) + _metrics([2], acc=70.0)[:-2] + ', "junk": [1, 2]}\n'
    (fresh_run / SPARSE_LOG).write_text(text)
    rows = build_report(fresh_run, latency_repeats=0)["curves"]["sparse"]
    assert [r["epoch"] for r in rows] == [1, 2] and rows[1]["test_acc"] == 72.0
    assert "junk" not in rows[1]


def test_checkpoint_fields_that_are_not_numbers_read_as_not_recorded(fresh_run):
    path = fresh_run / "pruned" / "pruned.pth"
    ckpt = load_checkpoint(path)
    ckpt.pop("checksum", None)
    ckpt.pop("threshold")
    save_checkpoint(ckpt, path)
    (fresh_run / EVAL).unlink()
    report = build_report(fresh_run, latency_repeats=0)
    assert report["threshold"] is None and report["stages"]["pruned"]["acc"] is None
    write_report(report, fresh_run)
    assert "| pruned | not measured |" in (fresh_run / "report.md").read_text()


LATENCY = LatencyBudget(0.5, "fraction", 1.2, True,
                        [LatencyRound(1.1, 1.2, 1.19, 0.03, 2.43, 0.04, 0.49, 0.02, 24)], batch=8).as_dict()
OLD = {"what": "latency", "kind": "fraction", "asked": 0.5, "target": 1.2, "achieved": 1.19,  # 0.2.0's files
       "fraction": 0.49, "fraction_spread": 0.02, "original": 2.43, "full": 2.4, "batch": 8}


@pytest.mark.parametrize("budget, shown", [
    (LATENCY, True),
    (OLD, True),
    ({**LATENCY, "asked": "0.5"}, False),  # a string where a number belongs: not recorded
    ({**LATENCY, "unit": "soon"}, False),
    ({**LATENCY, "chosen": 3}, False),
    ({**LATENCY, "rounds": [{**LATENCY["rounds"][0], "ratio": float("nan")}]}, False),
    ({**OLD, "fraction": "0.49"}, False),
    ({"what": "flops", "target": 1e6, "achieved": 9e5, "full": 2e6}, False),
])
@pytest.mark.slow
def test_a_latency_budget_is_reported_as_asked_and_measured(fresh_run, budget, shown):
    path = fresh_run / "pruned" / "pruned.pth"
    ckpt = load_checkpoint(path)
    ckpt.pop("checksum", None)
    ckpt["budget"] = budget
    save_checkpoint(ckpt, path)
    write_report(build_report(fresh_run, latency_repeats=0), fresh_run)
    md = (fresh_run / "report.md").read_text()
    spread = "0.03" if budget is LATENCY else "0"
    line = ("Latency budget asked at the cut: 1.2 ms (0.5 of the original, batch 8, eager); measured then: "
            f"0.490 +- 0.020 of the original (1.19 +- {spread} ms against its 2.43 ms, interleaved).")
    assert (line in md) == shown and ("Latency budget" in md) == shown, md


def test_report_of_missing_folder(tmp_path):
    with pytest.raises(SlimmingError, match="no such run folder"):
        build_report(tmp_path / "nope")
    with pytest.raises(SlimmingError, match="holds no checkpoint .* and no stage folder"):
        build_report(tmp_path)


@pytest.mark.slow
def test_report_of_each_command_s_own_folder_follows_its_sources(tmp_path, capsys):
    """train, prune and finetune each into a folder of its own (as docs/networks.md's commands
    do): the report of any of them is what the run was up to that folder, its stages told by
    their checkpoints and found through the sources they record; prune keeps the accuracy right
    after the cut in eval.json as the pipeline does."""
    runs = tmp_path / "runs"
    assert main(["train", "--arch", "vgg", "--cfg", TINY, "--epochs", "1", "--sparsity", "1e-2",
                 "--seed", "0", "--save", str(runs / "sparse"), *DATA]) == 0
    assert main(["prune", "--checkpoint", str(runs / "sparse" / "best.pth"), "--percent", "0.5",
                 "--save", str(runs / "pruned"), *DATA]) == 0
    out = capsys.readouterr().out
    acc = json.loads((runs / "pruned" / "eval.json").read_text())["acc"]
    assert f"accuracy right after the cut: {acc:.2f}%" in out
    assert main(["finetune", "--checkpoint", str(runs / "pruned" / "pruned.pth"), "--epochs", "1",
                 "--save", str(runs / "tuned"), *DATA]) == 0
    expected = {"sparse": ["sparse"], "pruned": ["sparse", "pruned"],
                "tuned": ["sparse", "pruned", "finetuned"]}
    for folder, stages in expected.items():
        report = build_report(runs / folder, latency_repeats=1)
        assert list(report["stages"]) == stages, folder
        assert report["curves"].keys() == {"sparse", "finetuned"} & set(stages)
        if "pruned" in stages:
            assert report["stages"]["pruned"]["acc"] == acc
            assert sum(b - a for _, b, a in report["layers"]) == 52  # half of the 104 channels
    assert main(["prune", "--checkpoint", str(runs / "sparse" / "best.pth"), "--percent", "0.3",
                 "--save", str(runs / "pruned"), "--overwrite", "--no-eval", "--cpu"]) == 0
    assert not (runs / "pruned" / "eval.json").exists()  # it was the other cut's accuracy


# ---------------------------------------------------------------------------------------------
# sweep: parse_percents, the reference row, what write_sweep writes

GOOD_PERCENTS = [
    ("0.1:0.9:0.1", [round(0.1 * i, 10) for i in range(1, 10)]),
    ("0.1:0.95:0.1", [round(0.1 * i, 10) for i in range(1, 10)]),  # stop not on the grid
    ("0.5,0.7", [0.5, 0.7]),
    ("0.7, 0.5,0.5 ,0.7", [0.5, 0.7]),  # sorted, duplicates removed
    ("0", [0.0]),
    ("0.3:0.3:0.1", [0.3]),
    ("0:0.99:0.01", [round(0.01 * i, 10) for i in range(100)]),  # exactly MAX_POINTS
    (" 0.5 ", [0.5]),
]


@pytest.mark.parametrize("text, expected", GOOD_PERCENTS)
def test_parse_percents_good(text, expected):
    assert parse_percents(text) == pytest.approx(expected)


BAD_PERCENTS = [
    ("0.1:1.0:0.1", "in [0, 1)"), ("1.2", "in [0, 1)"), ("-0.1", "in [0, 1)"), ("1", "in [0, 1)"),
    ("a,b", "start:stop:step"), ("", "start:stop:step"), ("0.5,", "start:stop:step"),
    ("0.1:0.5", "start:stop:step"), ("0.1:0.5:0.1:0.2", "start:stop:step"),
    ("nan", "nan"), ("0.5,inf", "nan"), ("0:nan:0.1", "nan"), ("0:0.5:inf", "nan"),
    ("0.5:0.1:-1", "step"), ("0.1:0.5:0", "step"), ("0.5:0.1:0.1", "below"),
    ("1.5:2:0.1", "start"), ("0:0.99:1e-9", "at most 100"), ("0:0.5:1e-300", "at most 100"),
    ("0:0.5:5e-324", "at most 100"), ("0:1e308:1e-308", "at most 100"),
    (",".join(f"{i / 1000:g}" for i in range(101)), "at most 100"),
]


@pytest.mark.parametrize("text, word", BAD_PERCENTS)
def test_parse_percents_bad(text, word):
    start = time.process_time()
    with pytest.raises(SlimmingError, match=re.escape(word)) as e:
        parse_percents(text)
    assert time.process_time() - start < 0.5  # the size is computed, no list built
    assert "--percents" in str(e.value) and "\n" not in str(e.value)


def test_parse_percents_cap_is_100():
    assert MAX_POINTS == 100


def test_sweep_reference_row_first(tiny_vgg):
    randomize_bn(tiny_vgg, torch.Generator().manual_seed(1), zero_frac=0.5)
    gen = torch.Generator().manual_seed(0)
    loader = [(torch.randn(16, 3, 32, 32, generator=gen), torch.randint(0, 10, (16,), generator=gen))]
    rows = sweep(tiny_vgg.eval(), loader, torch.device("cpu"), [0.0, 0.5, 0.3])
    assert [r["percent"] for r in rows] == [0.0, 0.3, 0.5]  # percent 0 is the reference itself
    assert [r["reference"] for r in rows] == [True, False, False]
    ref = rows[0]
    assert ref["threshold"] is None and ref["params_kept"] == ref["flops_kept"] == 1.0
    assert ref["params"] == slimming.count_params(tiny_vgg)
    assert rows[1]["params_kept"] < 1.0 and rows[2]["params_kept"] < rows[1]["params_kept"]


def test_write_sweep_files(tmp_path):
    rows = [{"percent": 0.0, "threshold": None, "params": 1000, "params_kept": 1.0, "flops": 9000,
             "flops_kept": 1.0, "acc": 80.0, "loss": 0.5, "reference": True},
            {"percent": 0.5, "threshold": 0.01, "params": 400, "params_kept": 0.4, "flops": 3000,
             "flops_kept": 1 / 3, "acc": 70.0, "loss": 0.9, "reference": False}]
    save = tmp_path / "sw"
    save.mkdir()
    outside = tmp_path / "outside"
    outside.write_text("precious")
    (save / "sweep.md").symlink_to(outside)
    written = write_sweep(rows, save)
    assert outside.read_text() == "precious" and not (save / "sweep.md").is_symlink()
    assert sorted(p.name for p in save.iterdir()) == sorted(p.name for p in written)
    csv_lines = (save / "sweep.csv").read_text().splitlines()
    assert csv_lines[0] == "percent,threshold,params,params_kept,flops,flops_kept,acc,loss,reference"
    assert csv_lines[1].startswith("0.0,,1000,1.0,") and csv_lines[1].endswith(",true")
    assert csv_lines[2].endswith(",false")
    md = (save / "sweep.md").read_text()
    assert "| 0 (unpruned) | 0.001M | 100.0% |" in md and "| 0.5 | 0.000M | 40.0% |" in md
    assert md.startswith("| channels removed | params |")
    assert json.loads((save / "sweep.json").read_text()) == rows


def test_a_budget_sweep_says_what_was_asked_and_flags_a_miss(tiny_vgg, tmp_path):
    """A sweep of FLOPs budgets: each row has the budget asked and whether the cut met it, in
    cells of their own (sweep.md: one measurement per cell); a budget no cut reaches under
    max_layer_prune is a row flagged **missed** that says why, and the sweep goes on; a row
    whose cut ended above its budget is flagged too; the picture leaves the missed row out."""
    gen = torch.Generator().manual_seed(0)
    loader = [(torch.randn(16, 3, 32, 32, generator=gen), torch.randint(0, 10, (16,), generator=gen))]
    rows = sweep(tiny_vgg.eval(), loader, torch.device("cpu"), [0.9, 0.05, 0.6], axis="flops",
                 options={"max_layer_prune": 0.5})
    assert [(r.get("target"), r.get("met")) for r in rows] == [(None, None), (0.05, False), (0.6, True),
                                                               (0.9, True)]
    assert rows[1]["acc"] is None and "cannot be met" in rows[1]["missed"] and "\n" not in rows[1]["missed"]
    assert rows[2]["flops_kept"] <= 0.6 and rows[3]["flops_kept"] <= 0.9
    rows[2]["met"] = False  # as a budget's cut that ended above it
    write_sweep(rows, tmp_path)
    lines = (tmp_path / "sweep.md").read_text().splitlines()
    assert lines[0].startswith("| budget asked | met | channels removed | params |")
    assert lines[2].startswith("| - | - | 0 (unpruned) |")
    assert lines[3].startswith("| 0.05 | **missed** | no cut reaches it: a budget of ")
    assert lines[4].startswith("| 0.6 | **missed** | ") and lines[5].startswith("| 0.9 | yes | ")
    assert all(line.count("|") == lines[0].count("|") for line in lines)
    assert json.loads((tmp_path / "sweep.json").read_text()) == rows
