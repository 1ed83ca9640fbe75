"""The command line end to end on the synthetic dataset, and its one-line errors."""

import json
import subprocess
import sys

import pytest
import torch

from slimming import count_params, load_model
from slimming.cli import main
from slimming.training.config import finetune_lr
from slimming.training.engine import lr_milestones

TINY = "8,M,16,M,16,16,M,24,M,24"
DATA = ["--dataset", "synthetic", "--workers", "0", "--cpu", "--batch-size", "128"]


def run(capsys, *argv):
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:  # argparse's own usage errors
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def sparse_run(tmp_path_factory):
    """One sparsity-trained tiny VGG shared by the tests below (1 epoch on synthetic data)."""
    save = tmp_path_factory.mktemp("runs") / "sparse"
    assert main(["train", "--arch", "vgg", "--cfg", TINY, "--epochs", "1", "--sparsity", "1e-3",
                 "--seed", "0", "--save", str(save), *DATA]) == 0
    return save


@pytest.mark.slow
def test_train_prune_finetune_eval(sparse_run, tmp_path, capsys):
    assert {p.name for p in sparse_run.iterdir()} >= {"last.pth", "best.pth", "metrics.jsonl"}
    rows = [json.loads(line) for line in (sparse_run / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["epoch"] == 1
    assert set(rows[0]) >= {"epoch", "lr", "train_loss", "test_loss", "test_acc", "gamma_lt_1e-2",
                            "seconds"}
    last = torch.load(sparse_run / "last.pth", weights_only=True)
    assert last["epoch"] == 1 and last["args"]["sparsity"] == 1e-3 and last["optimizer"]

    code, out, _ = run(capsys, "prune", "--checkpoint", sparse_run / "best.pth", "--percent",
                       "0.5", "--save", tmp_path / "pruned")
    assert code == 0 and "feature.1" in out and "parameters" in out
    pruned_path = tmp_path / "pruned" / "pruned.pth"
    # the accuracy right after the cut, on the checkpoint's own data: what eval says of the file
    after = float(out.split("accuracy right after the cut: ")[1].split("%")[0])
    assert f"(the checkpoint's: {last['acc']:.2f}%), on 512 test images of synthetic" in out
    code, out, _ = run(capsys, "eval", "--checkpoint", pruned_path)
    assert code == 0 and f"top-1 accuracy {after:.2f}%" in out
    pruned = torch.load(pruned_path, weights_only=True)
    assert pruned["cfg"] != [int(v) if v != "M" else v for v in TINY.split(",")]
    assert len(pruned["cfg_mask"]) == 6 and pruned["source_acc"] == last["acc"]
    assert count_params(load_model(pruned_path)) < count_params(load_model(sparse_run / "best.pth"))

    code, out, _ = run(capsys, "finetune", "--checkpoint", pruned_path, "--epochs", "1",
                       "--save", tmp_path / "ft", *DATA)
    assert code == 0
    ft = torch.load(tmp_path / "ft" / "best.pth", weights_only=True)
    assert ft["cfg"] == pruned["cfg"] and ft["args"]["sparsity"] == 0.0
    assert ft["cfg_mask"] is not None and ft["source"]["path"] == str(pruned_path)

    code, out, _ = run(capsys, "eval", "--checkpoint", tmp_path / "ft" / "best.pth", *DATA)
    assert code == 0 and f"top-1 accuracy {ft['acc']:.2f}%" in out


@pytest.mark.parametrize("epochs, lr, want", [("1", None, 0.001), ("3", None, 0.01), ("1", "0.05", 0.05)])
def test_a_fine_tune_takes_a_learning_rate_for_its_length(sparse_run, tmp_path, capsys, epochs, lr, want):
    """Issue 48, item 6: with no --lr, a fine-tune runs at the rate its length wants (0.1 lost the
    cut's accuracy in one epoch: benchmarks/RESULTS.md) and says so; --lr is taken as given."""
    lengths = (1, 2, 3, 79, 80, 160)
    assert [finetune_lr(e) for e in lengths] == pytest.approx([1e-3, 1e-3, 1e-2, 1e-2, 0.1, 0.1])
    code, out, _ = run(capsys, "finetune", "--checkpoint", sparse_run / "best.pth", "--epochs", epochs,
                       *(["--lr", lr] if lr else []), "--save", tmp_path / "ft", *DATA)
    first = json.loads((tmp_path / "ft" / "metrics.jsonl").read_text().splitlines()[0])
    assert code == 0 and first["lr"] == pytest.approx(want)
    assert (f"learning rate {want:g}, the default" in out) == (lr is None)


@pytest.mark.parametrize("after_cut", [100.0, 0.0])
def test_a_fine_tune_that_ends_below_the_cut_says_so(sparse_run, tmp_path, capsys, after_cut):
    """Issue 48, item 6: where the fine-tune's best accuracy is under the one right after the
    cut (eval.json beside pruned.pth, as slimming prune writes it), one line says so and what to
    try; where it is not, nothing."""
    code, _, _ = run(capsys, "prune", "--checkpoint", sparse_run / "best.pth", "--percent", "0.5",
                     "--save", tmp_path / "pruned", "--no-eval")
    (tmp_path / "pruned" / "eval.json").write_text(json.dumps({"acc": after_cut, "loss": 1.0, "count": 512}))
    code, _, err = run(capsys, "finetune", "--checkpoint", tmp_path / "pruned" / "pruned.pth",
                       "--epochs", "1", "--lr", "0.05", "--save", tmp_path / "ft", *DATA)
    assert code == 0
    said = [line for line in err.splitlines() if "below the accuracy right after the cut" in line]
    if after_cut:
        assert len(said) == 1 and "against 100.00%" in said[0] and "try --lr 0.005" in said[0]
    else:
        assert said == []


@pytest.mark.slow
def test_threshold_prune_and_outputs_are_not_overwritten(sparse_run, tmp_path, capsys):
    ckpt = sparse_run / "last.pth"
    gammas = torch.cat([bn.weight.detach().abs() for bn in load_model(ckpt).prunable_bns()])
    t = f"{gammas.median().item():.6f}"
    assert run(capsys, "prune", "--checkpoint", ckpt, "--threshold", t, "--save", tmp_path)[0] == 0
    first = (tmp_path / "pruned.pth").read_bytes()
    code, _, err = run(capsys, "prune", "--checkpoint", ckpt, "--percent", "0.2", "--save", tmp_path)
    assert code == 2 and "already exists" in err and "--overwrite" in err
    assert (tmp_path / "pruned.pth").read_bytes() == first
    assert run(capsys, "prune", "--checkpoint", ckpt, "--percent", "0.2", "--save", tmp_path,
               "--overwrite")[0] == 0
    assert (tmp_path / "pruned.pth").read_bytes() != first


@pytest.mark.slow
def test_learning_rate_drops_at_integer_milestones(tmp_path, capsys):
    assert lr_milestones(160) == [80, 120]
    assert lr_milestones(10) == [5, 7]  # the paper's float compare skips 7.5
    assert lr_milestones(2) == [1] and lr_milestones(1) == []
    code, _, _ = run(capsys, "train", "--arch", "vgg", "--cfg", "4,M,4,M,4,M,4,M,4", "--epochs",
                     "4", "--lr", "0.1", "--save", tmp_path, *DATA)
    assert code == 0
    lrs = [json.loads(line)["lr"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lrs == pytest.approx([0.1, 0.1, 0.01, 0.001])


@pytest.mark.slow
def test_nin_trains_from_the_command_line(tmp_path, capsys):
    code, out, _ = run(capsys, "train", "--arch", "nin", "--cfg", "8,8,8,8,8,8,8,8", "--epochs",
                       "1", "--sparsity", "1e-4", "--save", tmp_path, *DATA)
    assert code == 0 and load_model(tmp_path / "last.pth").cfg == [8] * 8


@pytest.mark.parametrize("argv,needle", [
    (["prune", "--checkpoint", "{tmp}/missing.pth", "--percent", "0.5", "--save", "{tmp}/o"],
     "no such file"),
    (["prune", "--checkpoint", "{tmp}", "--percent", "0.5", "--save", "{tmp}/o"], "directory"),
    (["prune", "--checkpoint", "{ckpt}", "--percent", "1.2", "--save", "{tmp}/o"], "percent"),
    (["prune", "--checkpoint", "{ckpt}", "--percent", "-0.1", "--save", "{tmp}/o"], "percent"),
    (["prune", "--checkpoint", "{ckpt}", "--threshold", "-1", "--save", "{tmp}/o"], "threshold"),
    (["prune", "--checkpoint", "{ckpt}", "--threshold", "99", "--save", "{tmp}/o"], "every"),
    (["prune", "--checkpoint", "{ckpt}", "--save", "{tmp}/o"], "--percent"),
    (["prune", "--checkpoint", "{junk}", "--percent", "0.5", "--save", "{tmp}/o"], "corrupt"),
    (["prune", "--checkpoint", "{ckpt}", "--percent", "0.5", "--save", "{junk}/o"], "is a file"),
    (["train", "--arch", "alexnet", "--save", "{tmp}/t", "--dataset", "synthetic"], "unknown arch"),
    (["prune", "--checkpoint", "{ckpt}", "--percent", "70", "--save", "{tmp}/o"], "did you mean 0.7?"),
    # resnet18: torchvision's, no pre-activation ResNet of depth 18 (9n+2)
    (["train", "--arch", "resnet18", "--save", "{tmp}/t"], "'resnet18'; did you mean torchvision:resnet18"),
    (["train", "--arch", "vgg16", "--save", "{tmp}/t"],
     "did you mean --arch vgg --depth 16 or torchvision:vgg16"),
    (["train", "--arch", "resnet20", "--save", "{tmp}/t"], "did you mean --arch resnet --depth 20?"),
    (["train", "--arch", "vgg", "--cfg", "8,X", "--save", "{tmp}/t"], "cfg"),
    (["train", "--epochs", "0", "--save", "{tmp}/t"], "positive integer"),
    (["train", "--lr", "-1", "--save", "{tmp}/t"], "positive"),
    (["train", "--dataset", "mnist", "--save", "{tmp}/t"], "invalid choice"),
    (["train", "--dataset", "imagefolder", "--data-root", "{tmp}", "--save", "{tmp}/t"],
     "train/"),
    (["train", "--dataset", "cifar10", "--data-root", "{tmp}/nodata", "--save", "{tmp}/t",
      "--cpu"], "--download"),
    (["eval", "--checkpoint", "{ckpt}", "--dataset", "imagefolder", "--cpu"], "--data-root"),
    (["finetune", "--checkpoint", "{missing}", "--save", "{tmp}/f", "--dataset", "synthetic",
      "--cpu"], "no such file"),
])
def test_user_errors_are_one_line_exit_2(argv, needle, tmp_path, sparse_run, capsys):
    junk = tmp_path / "junk.pth"
    junk.write_bytes(b"not a checkpoint")
    fill = {"tmp": tmp_path, "ckpt": sparse_run / "last.pth", "junk": junk,
            "missing": tmp_path / "missing.pth"}
    argv = [a.format(**fill) for a in argv]
    code, _, err = run(capsys, *argv)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert needle in lines[0]
    assert not (tmp_path / "o").exists() and not (tmp_path / "t").exists()


def test_a_latency_without_its_unit_is_said_to_be_milliseconds_once(capsys):
    """--target-latency 5 means 5 ms (a number >= 1): one note on stderr says so, once (the
    line is read twice: first for --config); 5ms and a fraction need no note."""
    from slimming.cli.parser import read_args

    for value, noted in (("5", True), ("5ms", False), ("0.5", False), ("12.5", True), ("5", True)):
        for argv in (["prune", "--checkpoint", "c.pth"], ["pipeline"]):
            args = read_args([*argv, "--target-latency", value, "--save", "o"])
            assert args.target_latency == value
            lines = capsys.readouterr().err.strip().splitlines()
            assert lines == ([f"note: --target-latency {value} is read as {float(value):g} ms (write "
                              f"{float(value):g}ms to say so; a fraction of the unpruned model's latency "
                              "is under 1, such as 0.5)"] if noted else []), lines


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_asked_for_where_there_is_none(sparse_run, capsys):
    code, _, err = run(capsys, "eval", "--checkpoint", sparse_run / "last.pth", "--device", "cuda",
                       "--dataset", "synthetic")
    assert code == 2 and "no CUDA device" in err


@pytest.mark.slow
def test_python_m_slimming_and_prune_does_not_import_torchvision(sparse_run, tmp_path):
    code = ("import sys; from slimming.cli import main; "
            f"rc = main(['prune', '--checkpoint', r'{sparse_run / 'last.pth'}', '--percent', "
            f"'0.3', '--save', r'{tmp_path}']); "
            "assert rc == 0; assert 'torchvision' not in sys.modules, 'torchvision imported'")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    help_text = subprocess.run([sys.executable, "-m", "slimming", "--help"], check=True,
                               capture_output=True, text=True).stdout
    assert all(cmd in help_text for cmd in ("train", "prune", "finetune", "eval"))


@pytest.mark.slow
def test_a_prune_whose_cifar_is_missing_says_so_without_importing_torchvision(sparse_run, tmp_path):
    """The checkpoint's data is CIFAR-10, not on this machine: the cut is saved, the accuracy
    not measured, and torchvision (1.3 s of the whole process) is not imported to find that out."""
    from slimming import load_checkpoint, save_checkpoint

    ckpt = load_checkpoint(sparse_run / "best.pth")
    ckpt["args"] = {**ckpt["args"], "dataset": "cifar10", "data_root": str(tmp_path / "none")}
    ckpt["data"] = {**ckpt["data"], "dataset": "cifar10", "data_root": str(tmp_path / "none")}
    save_checkpoint(ckpt, tmp_path / "c.pth")
    code = ("import sys; from slimming.cli import main; "
            f"rc = main(['prune', '--checkpoint', r'{tmp_path / 'c.pth'}', '--percent', '0.3', "
            f"'--save', r'{tmp_path / 'out'}', '--cpu']); "
            "assert rc == 0; assert 'torchvision' not in sys.modules, 'torchvision imported'")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert f"not measured (its data, cifar10, is not under {tmp_path / 'none'})" in run.stdout
    assert (tmp_path / "out" / "pruned.pth").exists()


def test_config_file_with_command_line_override(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("arch: vgg\ncfg: [4, M, 4, M, 4, M, 4, M, 4]\nepochs: 3\nsparsity: 1e-3\n"
                      "nesterov: true\nsched: cosine\nlabel_smoothing: 0.1\nno-wd-bn: true\n")
    code, _, _ = run(capsys, "train", "--config", config, "--epochs", "1", "--save", tmp_path / "r",
                     *DATA)
    assert code == 0
    args = torch.load(tmp_path / "r" / "last.pth", weights_only=True)["args"]
    assert args["epochs"] == 1  # the command line wins
    assert args["sparsity"] == 1e-3 and args["nesterov"] and args["sched"] == "cosine"
    assert args["cfg"] == [4, "M", 4, "M", 4, "M", 4, "M", 4] and args["no_wd_bn"]
    config.write_text("epochs: 1\nlearning_rate: 0.1\n")
    code, _, err = run(capsys, "train", "--config", config, "--save", tmp_path / "s", *DATA)
    assert code == 2 and "unknown key 'learning_rate'" in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_amp_bf16_channels_last_adamw_from_the_command_line(tmp_path, capsys):
    code, out, _ = run(capsys, "train", "--arch", "vgg", "--cfg", TINY, "--epochs", "1", "--amp",
                       "--channels-last", "--opt", "adamw", "--lr", "1e-3", "--grad-clip", "5",
                       "--warmup-epochs", "1", "--save", tmp_path, *DATA)
    assert code == 0
    ckpt = torch.load(tmp_path / "last.pth", weights_only=True)
    assert ckpt["args"]["amp"] and ckpt["scaler"] is not None
    assert "betas" in ckpt["optimizer"]["param_groups"][0]  # AdamW's state
    row = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert row["amp_skipped"] == 0 and row["lr"] == pytest.approx(0.5e-3)  # warm-up: half of lr
    model = load_model(tmp_path / "last.pth")
    assert model(torch.randn(1, 3, 32, 32)).dtype == torch.float32


def test_paper_checkpoint_from_the_command_line(tmp_path, capsys):
    """A file as the paper's code writes it (no arch) prunes and evaluates with --arch."""
    from slimming import models

    model = models.build("vgg", cfg=[4, "M", 4, "M", 4, "M", 4, "M", 4])
    paper = tmp_path / "model_best.pth.tar"
    torch.save({"epoch": 3, "best_prec1": 0.5, "optimizer": {},
                "state_dict": {f"module.{k}": v for k, v in model.state_dict().items()}}, paper)
    code, _, err = run(capsys, "prune", "--checkpoint", paper, "--percent", "0.5", "--save", tmp_path)
    assert code == 2 and "--arch" in err
    code, out, _ = run(capsys, "prune", "--checkpoint", paper, "--arch", "vgg", "--percent", "0.5",
                       "--save", tmp_path)
    pruned_cfg = load_model(tmp_path / "pruned.pth").cfg
    widths = [v for v in pruned_cfg if v != "M"]
    assert code == 0 and 10 <= sum(widths) < 20 and min(widths) >= 1  # half cut, guard kept 1+
    line = next(x for x in out.splitlines() if x.startswith("accuracy right after the cut"))
    if "not measured" in line:  # the file names no data: said whole, no dataset it never named
        assert line == ("accuracy right after the cut: not measured (the checkpoint does not say what "
                        "it was trained on); to measure it, give --dataset and --data-root (--no-eval "
                        "stops this line)")
    code, out, _ = run(capsys, "eval", "--checkpoint", paper, "--arch", "vgg", *DATA)
    assert code == 0 and "top-1 accuracy" in out


def test_prune_measures_the_cut_only_on_data_at_hand(sparse_run, tmp_path, capsys):
    """The checkpoint's dataset gone: one line says why there is no figure, and the cut is
    saved; --no-eval says nothing; data flags that do not read are an error, nothing written."""
    from slimming import load_checkpoint, save_checkpoint

    ckpt = load_checkpoint(sparse_run / "best.pth")
    ckpt["args"] = {**ckpt["args"], "dataset": "imagefolder", "data_root": str(tmp_path / "gone")}
    ckpt["data"] = {**ckpt["data"], "dataset": "imagefolder", "data_root": str(tmp_path / "gone")}
    save_checkpoint(ckpt, tmp_path / "moved.pth")
    code, out, err = run(capsys, "prune", "--checkpoint", tmp_path / "moved.pth", "--percent", "0.5",
                         "--save", tmp_path / "a", "--cpu")
    assert code == 0 and (tmp_path / "a" / "pruned.pth").exists(), err
    assert "accuracy right after the cut: not measured (its data, imagefolder, is not under" in out
    assert "(--no-eval stops this line)" in out
    code, out, _ = run(capsys, "prune", "--checkpoint", tmp_path / "moved.pth", "--percent", "0.5",
                       "--save", tmp_path / "b", "--cpu", "--no-eval")
    assert code == 0 and "accuracy right after" not in out
    code, out, err = run(capsys, "prune", "--checkpoint", sparse_run / "best.pth", "--percent", "0.5",
                         "--save", tmp_path / "c", "--cpu", "--dataset", "imagefolder", "--data-root",
                         tmp_path / "gone")
    error = [line for line in err.splitlines() if "error:" in line]
    assert code == 2 and len(error) == 1 and "gone" in error[0] and not (tmp_path / "c").exists()


def test_version_and_grouped_help_with_defaults(capsys):
    import slimming
    from slimming.cli.parser import build_parser

    assert run(capsys, "--version")[1].strip() == f"slimming {slimming.__version__}"
    parser = build_parser()
    for name, sub in parser._subparsers._group_actions[0].choices.items():
        text = sub.format_help()
        if name != "cache":  # every command that computes (cache only lists and removes files)
            assert {"device:"} <= {line.strip() for line in text.splitlines()}, name
            assert sub.get_default("cpu") is False and "--device DEVICE" in text
        for action in sub._actions:  # every flag says what it is, and its real default
            assert action.help, (name, action.dest)
            switch = isinstance(action.default, bool)  # a switch: its help says what it does
            if action.default not in (None, "==SUPPRESS==") and not switch and action.option_strings:
                assert "(default:" in sub._get_formatter()._format_action(action) or \
                    "default" in action.help, (name, action.dest)
    train = parser._subparsers._group_actions[0].choices["train"].format_help()
    for group in ("model:", "data:", "training:", "sparsity:", "output:", "device:"):
        assert f"\n{group}\n" in train
    assert "--lr LR" in train and "(default: 0.1)" in train


def test_prune_gives_the_same_file_whatever_the_device_flags(sparse_run, tmp_path, capsys):
    files = []
    for flags in (["--cpu"], ["--device", "cpu"], []):
        code, _, err = run(capsys, "prune", "--checkpoint", sparse_run / "best.pth", "--percent", "0.5",
                           "--save", tmp_path, "--overwrite", *flags)
        assert code == 0, err
        files.append((tmp_path / "pruned.pth").read_bytes())
        if not flags and not torch.cuda.is_available():
            assert err.count("no CUDA device found") == 1  # said once, only when not chosen
    assert files[0] == files[1] == files[2]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_prune_rebuilds_on_cuda_and_saves_the_cpu_file(sparse_run, tmp_path, capsys, monkeypatch):
    import slimming.cli.commands as commands

    seen = {}
    real = commands.prune

    def spy(model, **kw):
        result = real(model, **kw)
        seen["device"] = next(result.model.parameters()).device.type
        return result

    monkeypatch.setattr(commands, "prune", spy)
    assert run(capsys, "prune", "--checkpoint", sparse_run / "best.pth", "--percent", "0.5", "--save",
               tmp_path / "gpu")[0] == 0
    assert seen["device"] == "cuda"
    assert run(capsys, "prune", "--checkpoint", sparse_run / "best.pth", "--percent", "0.5", "--save",
               tmp_path / "cpu", "--cpu")[0] == 0
    gpu, cpu = (load_model(tmp_path / d / "pruned.pth").state_dict() for d in ("gpu", "cpu"))
    assert gpu.keys() == cpu.keys()
    # the kept weights are copied: equal bit for bit; compensation's constants are computed on
    # the device in float32 (TF32 off), so they may differ in the last bits
    folded = {k for k in cpu if k.endswith(("running_mean", "bias")) and not torch.equal(gpu[k], cpu[k])}
    assert all(torch.equal(gpu[k], cpu[k]) for k in cpu if k not in folded)
    assert all(torch.allclose(gpu[k], cpu[k], rtol=1e-4, atol=1e-5) for k in folded)
    for d in ("gpu", "cpu"):  # and with the paper's cut, the whole file is the same
        assert run(capsys, "prune", "--checkpoint", sparse_run / "best.pth", "--percent", "0.5", "--save",
                   tmp_path / f"{d}-paper", "--no-compensate", *(["--cpu"] if d == "cpu" else []))[0] == 0
    gpu, cpu = (load_model(tmp_path / f"{d}-paper" / "pruned.pth").state_dict() for d in ("gpu", "cpu"))
    assert all(torch.equal(gpu[k], cpu[k]) for k in cpu)


@pytest.mark.slow
def test_eval_and_sweep_default_to_the_data_the_checkpoint_was_trained_on(sparse_run, tmp_path, capsys):
    code, out, err = run(capsys, "eval", "--checkpoint", sparse_run / "best.pth", "--cpu")
    assert code == 0 and "test images of synthetic" in out, err
    code, _, _ = run(capsys, "prune", "--checkpoint", sparse_run / "best.pth", "--percent", "0.3",
                     "--save", tmp_path / "p")
    code, out, err = run(capsys, "eval", "--checkpoint", tmp_path / "p" / "pruned.pth", "--cpu")
    assert code == 0 and "test images of synthetic" in out, err  # carried through prune
    code, out, err = run(capsys, "sweep", "--checkpoint", sparse_run / "best.pth", "--percents", "0.5",
                         "--save", tmp_path / "s", "--cpu")
    assert code == 0, err
    from slimming.tools import plots

    with pytest.MonkeyPatch.context() as mp:  # without matplotlib: no picture, and a word why
        mp.setattr(plots, "available", lambda: False)
        code, out, err = run(capsys, "sweep", "--checkpoint", sparse_run / "best.pth", "--percents", "0.5",
                             "--save", tmp_path / "s2", "--cpu")
    assert code == 0 and not (tmp_path / "s2" / "sweep.png").exists(), err
    assert f"no sweep.png: {plots.MISSING}" in out and "pip install matplotlib" in plots.MISSING
    code, out, err = run(capsys, "sweep", "--checkpoint", sparse_run / "best.pth", "--target-flops",
                         "0.01,0.9", "--max-layer-prune", "0.5", "--save", tmp_path / "s3", "--cpu")
    assert code == 0 and "flops 0.01  missed: a budget of " in out and "flops 0.9" in out, err
    code, _, err = run(capsys, "eval", "--checkpoint", sparse_run / "best.pth", "--dataset", "cifar10",
                       "--data-root", tmp_path / "none", "--cpu")
    assert code == 2 and "cifar10 not found" in err  # a flag given still wins


def test_prune_warns_of_the_guard_and_of_a_model_without_sparsity(tmp_path, capsys):
    from slimming import checkpoint_dict, models, save_checkpoint

    model = models.build("vgg", cfg=[4, "M", 4, "M", 4, "M", 4, "M", 8])
    with torch.no_grad():
        for i, bn in enumerate(model.prunable_bns()):  # no sparsity; the first layer smallest
            bn.weight.fill_(0.5 + i)
    save_checkpoint(checkpoint_dict(model), tmp_path / "dense.pth")
    code, _, err = run(capsys, "prune", "--checkpoint", tmp_path / "dense.pth", "--percent", "0.3",
                       "--save", tmp_path / "p", "--cpu")
    lines = sorted(err.strip().splitlines(), key=lambda line: "guard" not in line)
    assert code == 0 and len(lines) == 2, err
    assert all(x.startswith("slimming prune: warning: ") for x in lines), err
    assert "feature.1" in lines[0] and "--min-channels guard" in lines[0]
    assert "0.0% of the |gamma| (scaling factors) are under 0.01" in lines[1] and "--sparsity" in lines[1]
    with torch.no_grad():
        for bn in model.prunable_bns():
            bn.weight[: bn.num_features // 2] = 1e-4  # sparsity-trained: half the channels near 0
    save_checkpoint(checkpoint_dict(model), tmp_path / "sparse.pth")
    code, _, err = run(capsys, "prune", "--checkpoint", tmp_path / "sparse.pth", "--percent", "0.5",
                       "--save", tmp_path / "q", "--cpu")
    assert code == 0 and err == "", err  # nothing to warn about


@pytest.mark.parametrize("argv,needle", [
    (["prune", "--precent", "0.5", "--checkpoint", "x.pth"],
     "unrecognized argument --precent; did you mean --percent?"),
    (["train", "--epoch", "3"], "unrecognized argument --epoch; did you mean --epochs?"),  # no prefix match
    (["train", "--epoch=3"], "unrecognized argument --epoch; did you mean --epochs?"),
    (["prnue", "--percent", "0.5"], "unknown command prnue; did you mean prune?"),
    (["prune", "--zzzz"], "unrecognized argument --zzzz (see"),
])
def test_a_typo_is_named_with_the_nearest_flag(capsys, argv, needle):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and needle in err, err


def test_prune_prints_what_percent_counts(sparse_run, tmp_path, capsys):
    code, out, _ = run(capsys, "prune", "--checkpoint", sparse_run / "best.pth", "--percent", "0.5",
                       "--save", tmp_path / "p", "--cpu")
    line = next(x for x in out.splitlines() if x.startswith("ranked "))
    ranked = int(line.split()[1])
    assert code == 0 and f": {ranked // 2} cut (" in line and f"--percent 0.5 asked {ranked // 2})" in line


@pytest.mark.parametrize(("flags", "verify", "cut_heads"), [
    ((), True, True), (("--no-verify",), False, True), (("--no-cut-heads",), True, False)])
def test_the_check_and_the_heads_are_two_flags(flags, verify, cut_heads, sparse_run, tmp_path, capsys,
                                               monkeypatch):
    """--no-verify only skips the comparison; what may be cut is --no-cut-heads, apart."""
    from slimming.tools import prune_checkpoint

    seen = {}

    def spy(model, **options):
        seen.update(options)
        return slimming_prune(model, **options)

    slimming_prune = prune_checkpoint.prune
    monkeypatch.setattr(prune_checkpoint, "prune", spy)
    code, _, err = run(capsys, "prune", "--checkpoint", sparse_run / "best.pth", "--percent", "0.5",
                       "--save", tmp_path, "--cpu", "--no-eval", *flags)
    assert code == 0, err
    assert seen["verify"] is verify and seen["cut_heads"] is cut_heads


@pytest.mark.parametrize("argv,says,never", [
    (["prune", "--target-latency", "0.5", "--latency-batch", "1.5"], "1.5 is not a whole number",
     "not a number"),
    (["prune", "--target-latency", "0.5", "--latency-batch", "1e30"], "1e30 is not a whole number",
     "not a number"),
    (["prune", "--percent", "0.5", "--round-to", "1.5"], "1.5 is not a whole number", "not a number"),
    (["sweep", "--target-latency", "nan"], "fraction of the unpruned model's latency, in (0, 1)", "percent"),
    (["sweep", "--target-latency", "-1"], "of the unpruned model's latency, got -1", "percent"),
    (["sweep", "--target-latency", "2,3ms"], "fractions of the unpruned model's latency", "channels"),
    (["sweep", "--target-flops", "1e400"], "fraction of the unpruned model's count", "percent"),
    (["sweep", "--target-params", "0.5:0.1:0.1"], "below the start", "percent"),
])
def test_a_budget_flag_s_error_speaks_of_what_it_takes(argv, says, never, tmp_path, capsys):
    """Hostile round 6: '1.5' was "not a number", and nine sweep --target-latency errors spoke of
    percents; each says what the flag takes, in one line, exit 2, before any data is read."""
    from slimming import checkpoint_dict, models, save_checkpoint

    save_checkpoint(checkpoint_dict(models.build("vgg", cfg=[8, "M", 8, "M", 8, "M", 8, "M", 8])),
                    tmp_path / "c.pth")
    try:  # argparse's errors exit, slimming's are returned
        code = main([argv[0], "--checkpoint", str(tmp_path / "c.pth"), *argv[1:],
                     "--save", str(tmp_path / "o"), "--cpu"])
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and says in err and never not in err and err.count("\n") == 1, err


def test_prune_under_inference_mode_is_the_prune_outside_it():
    """Hostile round 6: under torch.inference_mode() the check refused "its own cut" and asked
    to report the network; inference mode is off inside prune, and the cut is the same."""
    import torchvision
    from conftest import sparsity_shaped

    import slimming

    model = torchvision.models.resnet18(num_classes=10).eval()
    sparsity_shaped(model, 2)
    outside = slimming.prune(model, percent=0.3, example_inputs=torch.zeros(1, 3, 32, 32))
    with torch.inference_mode():
        inside = slimming.prune(model, percent=0.3, example_inputs=torch.zeros(1, 3, 32, 32))
    assert inside.cfg == outside.cfg and inside.verified is not None
    assert all(not p.is_inference() and p.requires_grad for p in inside.model.parameters())


def test_the_depths_the_hints_offer_are_the_families_own():
    """The command line's depth rules (read before torch is imported) are the families'."""
    from slimming.cli.parser import DEPTHS
    from slimming.models import densenet, preresnet, vgg

    def builds(check, depth):
        try:
            return check(depth) > 0
        except ValueError:
            return False

    for depth in range(1, 1010):
        assert DEPTHS["vgg"](depth) == (depth in vgg.DEFAULT_CFGS)
        assert DEPTHS["preresnet"](depth) == builds(preresnet.blocks_per_stage, depth), depth
        assert DEPTHS["densenet"](depth) == builds(densenet.layers_per_block, depth), depth
