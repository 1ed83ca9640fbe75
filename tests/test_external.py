"""Your own network through every command: torchvision:NAME, timm:NAME and
package.module:function architectures, checkpoints that rebuild themselves (no pickled code),
--init from your own weights."""

import importlib.util
import json
import textwrap

import pytest
import torch

import slimming
from slimming import checkpoint_dict, load_checkpoint, load_model, models, save_checkpoint
from slimming.cli import main

pytest.importorskip("torchvision")
MV2 = ["--arch", "torchvision:mobilenet_v2", "--model-kwargs", '{"width_mult": 0.25}']
DATA = ["--dataset", "synthetic", "--cpu", "--batch-size", "128"]


def run(capsys, *argv):
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    save = tmp_path_factory.mktemp("ext") / "sparse"
    assert main(["train", *MV2, "--epochs", "1", "--sparsity", "1e-3", "--seed", "0",
                 "--save", str(save), *DATA]) == 0
    return save


@pytest.mark.slow
def test_a_torchvision_model_through_every_command(trained, tmp_path, capsys):
    ckpt = torch.load(trained / "best.pth", weights_only=True)
    assert ckpt["arch"] == "torchvision:mobilenet_v2" and ckpt["cfg"] is None
    assert ckpt["options"] == {"num_classes": 10, "kwargs": {"width_mult": 0.25}, "input_size": [3, 32, 32]}
    assert ckpt["data"]["dataset"] == "synthetic"

    code, out, err = run(capsys, "prune", "--checkpoint", trained / "best.pth", "--percent", "0.4",
                         "--save", tmp_path / "p", "--cpu")
    assert code == 0, err
    pruned = torch.load(tmp_path / "p" / "pruned.pth", weights_only=True)
    assert isinstance(pruned["cfg"], dict) and "features.2.conv.0.1" in pruned["cfg"]
    assert pruned["data"] == ckpt["data"] and "mean" in pruned["data"]  # carried whole
    assert not any("Module" in type(v).__name__ for v in pruned.values())  # tensors and plain values
    model = load_model(tmp_path / "p" / "pruned.pth")  # rebuilt from builder + widths
    assert model.features[2].conv[0][1].num_features == pruned["cfg"]["features.2.conv.0.1"]

    code, out, err = run(capsys, "eval", "--checkpoint", tmp_path / "p" / "pruned.pth", "--cpu")
    assert code == 0 and "synthetic" in out, err
    code, _, err = run(capsys, "finetune", "--checkpoint", tmp_path / "p" / "pruned.pth", "--epochs", "1",
                       "--save", tmp_path / "ft", *DATA)
    assert code == 0, err
    assert load_model(tmp_path / "ft" / "last.pth").cfg == pruned["cfg"]
    code, out, err = run(capsys, "stats", "--checkpoint", trained / "best.pth", "--compare",
                         tmp_path / "ft" / "last.pth", "--repeats", "1", "--json", "--cpu")
    stats = json.loads(out)
    before, after = stats[str(trained / "best.pth")], stats[str(tmp_path / "ft" / "last.pth")]
    assert code == 0 and after["params"] < before["params"] and after["flops"] < before["flops"]
    code, _, err = run(capsys, "sweep", "--checkpoint", trained / "best.pth", "--percents", "0.5",
                       "--save", tmp_path / "sw", "--cpu")
    assert code == 0, err
    onnx = importlib.util.find_spec("onnxruntime") is not None  # the [onnx] extra, in [dev]
    for fmt, name in (("export", "m.pt2"), ("onnx", "m.onnx"), ("torchscript", "m.ts")):
        if fmt == "onnx" and not onnx:
            continue
        code, out, err = run(capsys, "export", "--checkpoint", tmp_path / "ft" / "last.pth", "--format",
                             fmt, "--out", tmp_path / name, "--cpu")
        assert code == 0 and "largest difference" in out, err
    import shutil

    run_dir = tmp_path / "run"  # a pipeline's layout, for report
    for stage, source in (("sparse", trained), ("pruned", tmp_path / "p"), ("finetuned", tmp_path / "ft")):
        shutil.copytree(source, run_dir / stage)
    code, out, err = run(capsys, "report", "--run", run_dir, "--repeats", "0", "--cpu")
    report = json.loads((run_dir / "report.json").read_text())
    assert code == 0 and report["stages"]["finetuned"]["params"] < report["stages"]["sparse"]["params"]
    assert "the widths of 52 layers with a scaling factor" in (run_dir / "report.md").read_text()
    code, out, err = run(capsys, "train", *MV2, "--epochs", "2", "--resume", "auto", "--save", trained,
                         *DATA)
    assert code == 0 and "resuming from epoch 1" in out, err


def test_a_pruned_checkpoint_rebuilds_the_same_network(tmp_path):
    model = models.build("torchvision:resnet18", num_classes=7, input_size=[3, 48, 48]).eval()
    with torch.no_grad():
        for bn in (m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)):
            bn.weight.uniform_(0, 1)
    result = slimming.prune(model, percent=0.6)  # traced at the model's own 3x48x48
    save_checkpoint(checkpoint_dict(result.model, cfg_mask=result.cfg_mask), tmp_path / "p.pth")
    rebuilt = load_model(tmp_path / "p.pth")
    x = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        assert torch.equal(rebuilt(x), result.model.eval()(x))
    assert rebuilt.input_size == (3, 48, 48) and rebuilt.fc.out_features == 7


@pytest.mark.slow
def test_a_timm_model_trains_and_prunes(tmp_path, capsys):
    pytest.importorskip("timm")
    code, _, err = run(capsys, "train", "--arch", "timm:test_efficientnet", "--epochs", "1", "--save",
                       tmp_path / "t", *DATA)
    assert code == 0, err
    code, _, err = run(capsys, "prune", "--checkpoint", tmp_path / "t" / "last.pth", "--percent", "0.3",
                       "--save", tmp_path / "p", "--cpu")
    assert code == 0, err
    assert load_model(tmp_path / "p" / "pruned.pth").arch == "timm:test_efficientnet"


USER_MODULE = textwrap.dedent("""
    from torch import nn

    def small_cnn(num_classes=10, width=8):
        return nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1, bias=False), nn.BatchNorm2d(2 * width), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * width, num_classes))
""")


def test_your_own_function_runs_only_when_you_name_it(tmp_path, monkeypatch, capsys):
    (tmp_path / "my_nets.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    arch = ["--arch", "my_nets:small_cnn"]
    code, out, err = run(capsys, "train", *arch, "--model-kwargs", '{"width": 6}', "--epochs", "1",
                         "--save", tmp_path / "t", *DATA)
    assert code == 0, err
    ckpt = tmp_path / "t" / "last.pth"
    code, _, err = run(capsys, "prune", "--checkpoint", ckpt, "--percent", "0.3", "--save", tmp_path / "p",
                       "--cpu")
    assert code == 2 and "your own code" in err and "--arch my_nets:small_cnn" in err
    with pytest.raises(slimming.CheckpointError, match="your own code"):
        load_checkpoint(ckpt)
    code, _, err = run(capsys, "prune", "--checkpoint", ckpt, *arch, "--percent", "0.3", "--save",
                       tmp_path / "p", "--cpu")
    assert code == 0, err
    net = load_model(tmp_path / "p" / "pruned.pth", arch="my_nets:small_cnn")
    assert net[1].num_features + net[5].num_features < 6 + 12


@pytest.mark.slow
def test_init_starts_from_your_weights_and_refuses_ones_that_do_not_fit(tmp_path, capsys):
    mine = models.build("torchvision:mobilenet_v2", num_classes=10, kwargs={"width_mult": 0.25})
    torch.save({"model": mine.state_dict()}, tmp_path / "mine.pth")
    seen = {}
    import slimming.cli.commands as commands

    real = commands.load_init

    def spy(model, path):
        real(model, path)
        seen["equal"] = all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                               mine.state_dict().values()))

    commands.load_init = spy
    try:
        code, _, err = run(capsys, "train", *MV2, "--init", tmp_path / "mine.pth", "--epochs", "1",
                           "--save", tmp_path / "t", *DATA)
    finally:
        commands.load_init = real
    assert code == 0 and seen["equal"], err
    other = models.build("torchvision:mobilenet_v2", num_classes=5, kwargs={"width_mult": 0.25})
    torch.save(other.state_dict(), tmp_path / "other.pth")
    code, _, err = run(capsys, "train", *MV2, "--init", tmp_path / "other.pth", "--epochs", "1",
                       "--save", tmp_path / "u", *DATA)
    assert code == 2 and "do not fit" in err and "--num-classes" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "u").exists()
