"""slimming stats and slimming export."""

import json
import re
import sys

import pytest
import torch
from torch import nn

from slimming import checkpoint_dict, count_flops, load_model, models, prune, save_checkpoint
from slimming.cli import main
from slimming.measure.stats import format_stats, latency_ms, model_stats, size_on_disk
from slimming.tools.export import ExportError, export_model

CFG = [8, "M", 16, "M", 16, "M", 16, "M", 24]


def analytic_flops(cfg, num_classes=10):
    """2 x multiply-adds of the convs and the classifier of a 32x32 CIFAR VGG."""
    flops, cin, side = 0, 3, 32
    for v in cfg:
        if v == "M":
            side //= 2
        else:
            flops += 2 * cin * v * 9 * side * side
            cin = v
    return flops + 2 * cin * num_classes


def test_flops_follow_the_papers_convention():
    assert count_flops(models.build("vgg", cfg=CFG)) == analytic_flops(CFG)
    assert round(count_flops(models.build("vgg", depth=19)) / 1e8, 2) == 7.96


def test_stats_of_a_pruned_network_shrink_together():
    model = models.build("vgg", cfg=CFG).eval()
    small = prune(model, percent=0.5).model
    a, b = model_stats(model, repeats=2), model_stats(small, repeats=2)
    assert b["params"] < a["params"] and b["flops"] == analytic_flops(small.cfg)
    assert b["size_bytes"] < a["size_bytes"] == size_on_disk(model)
    assert set(a["latency_ms"]) == {1, 64} and all(v > 0 for v in a["latency_ms"].values())
    table = format_stats(a, b, ("before", "after"))
    assert f"{b['params'] / a['params']:.3f}x" in table and "latency, batch 64" in table
    assert latency_ms(model, 2, repeats=1) > 0


def test_networks_compared_are_timed_together_and_their_ratio_holds_on_a_busy_machine(monkeypatch):
    """compare_stats times the networks in turn, in one run: a busy spell that slows a whole
    round (both alike, tenfold here) leaves the ratio where it is, and it is printed with its
    spread; a single latency is the fastest tenth, not the mean a spell drags up."""
    from slimming.measure import stats as stats_module

    rounds = [1.0] * 8 + [10.0] * 4  # a third of the rounds in a busy spell
    monkeypatch.setattr(stats_module, "time_interleaved", lambda models, inputs, repeats, warmup:
                        [[4.0 * r for r in rounds], [1.0 * r for r in rounds]])
    model = models.build("vgg", cfg=CFG).eval()
    small = prune(model, percent=0.5).model
    a, b = stats_module.compare_stats([model, small], repeats=12)
    assert b["latency_ratio"] == {1: [0.25, 0.0], 64: [0.25, 0.0]} and "latency_ratio" not in a
    assert a["latency_ms"][1] == pytest.approx(4.0) and b["latency_ms"][64] == pytest.approx(1.0)
    table = format_stats(a, b, ("before", "after"))
    assert "0.250x +- 0.000" in table and "4.00 +- 0 ms" in table


@pytest.fixture
def ckpts(tmp_path):
    torch.manual_seed(0)
    model = models.build("vgg", cfg=CFG).eval()
    save_checkpoint(checkpoint_dict(model), tmp_path / "big.pth")
    save_checkpoint(checkpoint_dict(prune(model, percent=0.6).model), tmp_path / "small.pth")
    return tmp_path


def test_stats_cli_compare_and_json(ckpts, capsys):
    assert main(["stats", "--checkpoint", str(ckpts / "big.pth"), "--compare",
                 str(ckpts / "small.pth"), "--repeats", "2", "--cpu"]) == 0
    out = capsys.readouterr().out
    assert "ratio" in out and "FLOPs" in out and "latency, batch 1" in out and "timed in turn" in out
    assert re.search(r"latency, batch 1 .* ms .*x \+- \d", out), out
    assert main(["stats", "--checkpoint", str(ckpts / "big.pth"), "--repeats", "0", "--json",
                 "--cpu"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data[str(ckpts / "big.pth")]["flops"] == analytic_flops(CFG)


def test_stats_layers_shows_each_layer_before_and_after(ckpts, capsys):
    """--layers: each convolution and linear layer with its widths and its time alone, the
    pruned network's beside it by name (what a latency budget's table is made of)."""
    assert main(["stats", "--checkpoint", str(ckpts / "big.pth"), "--compare", str(ckpts / "small.pth"),
                 "--repeats", "0", "--layers", "--json", "--cpu"]) == 0
    data = json.loads(capsys.readouterr().out)
    big, small = data[str(ckpts / "big.pth")]["layers"], data[str(ckpts / "small.pth")]["layers"]
    widths = [v for v in CFG if v != "M"]
    assert [(r["in"], r["out"]) for r in big] == [*zip([3, *widths[:-1]], widths), (24, 10)]
    assert [r["name"] for r in big] == [r["name"] for r in small] and all(r["ms"] > 0 for r in big + small)
    pruned = load_model(ckpts / "small.pth")
    assert small[0]["out"] == pruned.feature[0].out_channels < 8
    assert main(["stats", "--checkpoint", str(ckpts / "big.pth"), "--compare", str(ckpts / "small.pth"),
                 "--repeats", "0", "--layers", "--cpu"]) == 0
    out = capsys.readouterr().out
    assert "3>8" in out  # the first conv: 3 channels in, 8 out, before the cut
    assert out.count("x\n") >= len(big) and "sum" in out and "timed alone" in out


@pytest.mark.parametrize("fmt,name", [("export", "m.pt2"), ("torchscript", "m.ts"), ("onnx", "m.onnx")])
@pytest.mark.slow
def test_export_formats_reproduce_the_model(ckpts, fmt, name, capsys):
    if fmt == "onnx":
        pytest.importorskip("onnxruntime")
    out = ckpts / name
    assert main(["export", "--checkpoint", str(ckpts / "small.pth"), "--format", fmt,
                 "--out", str(out)]) == 0
    assert out.exists() and "largest difference" in capsys.readouterr().out
    assert not [p for p in ckpts.iterdir() if ".tmp" in p.name]
    code = main(["export", "--checkpoint", str(ckpts / "small.pth"), "--format", fmt,
                 "--out", str(out)])
    assert code == 2 and "--overwrite" in capsys.readouterr().err


def test_exported_program_runs_any_batch(ckpts):
    from slimming import load_model

    model = load_model(ckpts / "small.pth")
    export_model(model, ckpts / "p.pt2", "export")
    program = torch.export.load(str(ckpts / "p.pt2")).module()
    x = torch.randn(7, 3, 32, 32)
    assert torch.allclose(program(x), model(x), atol=1e-5)


def test_a_wrong_export_is_refused_and_leaves_no_file(ckpts, monkeypatch):
    from slimming.tools import export

    monkeypatch.setitem(export.RUNNERS, "torchscript", lambda m, x, p: m(x) + 1.0)
    model = models.build("vgg", cfg=CFG).eval()
    with pytest.raises(ExportError, match="does not reproduce"):
        export_model(model, ckpts / "bad.ts", "torchscript")
    assert not [p for p in ckpts.iterdir() if p.name.startswith((".bad", "bad"))]
    with pytest.raises(ExportError, match=".pt2"):
        export_model(model, ckpts / "bad.bin", "export")


def test_onnx_without_its_extra_is_one_clear_line(ckpts, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import fails
    code = main(["export", "--checkpoint", str(ckpts / "small.pth"), "--format", "onnx",
                 "--out", str(ckpts / "x.onnx")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and ".[onnx]" in err[0]
    assert not (ckpts / "x.onnx").exists()


def test_nin_exports_too(tmp_path):
    model = models.build("nin", cfg=[8] * 8).eval()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.weight.data.uniform_(0, 1)
    small = prune(model, percent=0.4).model
    assert export_model(small, tmp_path / "nin.pt2", "export") <= 1e-4


@pytest.mark.parametrize("argv", [
    ["export", "--format", "export", "--out", "{out}/m.pt2"],
    ["export", "--format", "torchscript", "--out", "{out}/m.pt"],
    ["prune", "--percent", "0.3", "--no-eval", "--save", "{out}"],
])
@pytest.mark.slow
def test_a_disk_that_fills_mid_write_is_one_line_naming_the_file(ckpts, argv):
    """Writes past a size limit fail as on a full disk (RLIMIT_FSIZE, SIGXFSZ ignored): one line
    that names the file, no temporary left. torch's archive writer used to abort the export in
    C++ (exit 134) after its line; the prune said 'error: : No space left on device'."""
    import resource
    import signal
    import subprocess

    out = ckpts / "out"
    out.mkdir()

    def small_disk():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    args = [a.format(out=out) for a in argv]
    run = subprocess.run([sys.executable, "-m", "slimming", args[0], "--checkpoint", str(ckpts / "big.pth"),
                          *args[1:], "--cpu"], capture_output=True, text=True, preexec_fn=small_disk,
                         env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    target = args[args.index("--out") + 1] if "--out" in args else f"{out}/pruned.pth"
    assert run.returncode == 1, run.stderr
    assert run.stderr.strip().splitlines()[-1] == f"slimming {args[0]}: error: {target}: File too large"
    assert "Traceback" not in run.stderr and "terminate" not in run.stderr
    assert list(out.iterdir()) == []


def test_a_legal_long_file_name_is_written(ckpts):
    """A 254-character name is legal; the temporary file beside it must be too."""
    from slimming import load_pruned, save_pruned

    model = models.build("vgg", cfg=CFG).eval()
    path = ckpts / ("m" * 250 + ".pth")
    save_pruned(model, path)
    assert load_pruned(path, models.build("vgg", cfg=CFG)).state_dict().keys() == model.state_dict().keys()
    export_model(model, ckpts / ("e" * 250 + ".pt2"), "export")
