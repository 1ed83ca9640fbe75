"""Nothing lost, nothing executed: bad input, hostile and corrupt files, kills, numerical
trouble and determinism, across the commands."""

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import randomize_bn

import models
from slimming import CheckpointError, checkpoint_dict, load_checkpoint, load_model, save_checkpoint
from slimming.cli import main
from slimming.engine import Trainer, TrainingError, make_scheduler

TINY = [8, "M", 16, "M", 16, "M", 16, "M", 16]
SYN = ["--dataset", "synthetic", "--cpu"]


class Evil:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A valid checkpoint and a zoo of bad inputs, built once (read-only for the cases)."""
    d = tmp_path_factory.mktemp("files")
    model = models.build("vgg", cfg=TINY)
    randomize_bn(model, torch.Generator().manual_seed(0))
    save_checkpoint(checkpoint_dict(model, acc=10.0), d / "good.pth")
    data = (d / "good.pth").read_bytes()
    (d / "empty.pth").write_bytes(b"")
    (d / "truncated.pth").write_bytes(data[: len(data) // 3])
    (d / "random.pth").write_bytes(random.Random(0).randbytes(4096))
    torch.save({"arch": "vgg", "state_dict": {}, "x": Evil(d / "pwned")}, d / "evil.pth")
    other = checkpoint_dict(model)
    other["arch"], other["cfg"] = "nin", None
    save_checkpoint(other, d / "otherarch.pth")
    wrong = checkpoint_dict(model)
    wrong["cfg"] = [8, "M", 16, "M", 16, "M", 16, "M", 12]
    save_checkpoint(wrong, d / "wrongcfg.pth")
    torch.save({"state_dict": model.state_dict()}, d / "noarch.pth")
    (d / "afile").write_text("I am a file")
    (d / "nolayout").mkdir()
    for split in ("train", "test"):
        (d / "emptyclass" / split / "cat").mkdir(parents=True)
    yaml_bad = d / "bad.yaml"
    yaml_bad.write_text("epochs: 1\nlearnig_rate: 0.1\n")
    return d


# (argv, needle in the one stderr line, expected exit code)
CASES = [
    (["prune", "--checkpoint", "{f}/missing.pth", "--percent", "0.5", "--save", "{o}"], "no such file", 2),
    (["prune", "--checkpoint", "{f}", "--percent", "0.5", "--save", "{o}"], "directory", 2),
    (["prune", "--checkpoint", "{f}/empty.pth", "--percent", "0.5", "--save", "{o}"], "corrupt", 2),
    (["prune", "--checkpoint", "{f}/truncated.pth", "--percent", "0.5", "--save", "{o}"], "corrupt", 2),
    (["prune", "--checkpoint", "{f}/random.pth", "--percent", "0.5", "--save", "{o}"], "corrupt", 2),
    (["prune", "--checkpoint", "{f}/evil.pth", "--percent", "0.5", "--save", "{o}"], "refused", 2),
    (["prune", "--checkpoint", "{f}/otherarch.pth", "--percent", "0.5", "--save", "{o}"],
     "cannot rebuild", 2),
    (["prune", "--checkpoint", "{f}/wrongcfg.pth", "--percent", "0.5", "--save", "{o}"], "do not fit", 2),
    (["prune", "--checkpoint", "{f}/noarch.pth", "--percent", "0.5", "--save", "{o}"], "--arch", 2),
    (["prune", "--checkpoint", "{f}/good.pth", "--arch", "nin", "--percent", "0.5", "--save", "{o}"],
     "not 'nin'", 2),
    (["prune", "--checkpoint", "{f}/good.pth", "--percent", "1", "--save", "{o}"], "percent", 2),
    (["prune", "--checkpoint", "{f}/good.pth", "--percent", "-0.2", "--save", "{o}"], "percent", 2),
    (["prune", "--checkpoint", "{f}/good.pth", "--threshold", "-1", "--save", "{o}"], "threshold", 2),
    (["prune", "--checkpoint", "{f}/good.pth", "--threshold", "50", "--save", "{o}"], "every", 2),
    (["prune", "--checkpoint", "{f}/good.pth", "--threshold", "0", "--save", "{o}"], "prunes no channel", 2),
    (["prune", "--checkpoint", "{f}/good.pth", "--percent", "0.5", "--threshold", "0.1", "--save", "{o}"],
     "not allowed with", 2),
    (["prune", "--checkpoint", "{f}/good.pth", "--percent", "0.5", "--save", "{f}/afile/x"], "is a file", 2),
    (["train", "--cfg", "8,M,8", "--epochs", "0", "--save", "{o}", *SYN], "positive integer", 2),
    (["train", "--batch-size", "-4", "--save", "{o}", *SYN], "positive integer", 2),
    (["train", "--lr", "0", "--save", "{o}", *SYN], "positive", 2),
    (["train", "--arch", "alexnet", "--save", "{o}", *SYN], "unknown arch", 2),
    (["train", "--arch", "vgg", "--depth", "12", "--save", "{o}", *SYN], "depth", 2),
    (["train", "--dataset", "imagenet", "--save", "{o}"], "invalid choice", 2),
    (["train", "--dataset", "imagefolder", "--data-root", "{f}/nolayout", "--save", "{o}", "--cpu"],
     "train/", 2),
    (["train", "--dataset", "imagefolder", "--data-root", "{f}/emptyclass", "--save", "{o}", "--cpu"],
     "cat", 2),
    (["train", "--dataset", "imagefolder", "--save", "{o}", "--cpu"], "--data-root", 2),
    (["train", "--device", "cuda:0", "--save", "{o}", "--dataset", "synthetic"], "no CUDA device", 2),
    (["train", "--save", "{f}/afile", *SYN], "is a file", 2),
    (["train", "--save", "/proc/slimming-test/run", *SYN], "cannot write in /proc", 2),
    (["prune", "--checkpoint", "{f}/good.pth", "--percent", "0.5", "--save", "/proc/x"],
     "cannot write in /proc", 2),
    (["train", "--deterministic", "--save", "{o}", *SYN], "--seed", 2),
    (["train", "--amp-dtype", "bfloat16", "--save", "{o}", *SYN], "--amp", 2),
    (["train", "--config", "{f}/bad.yaml", "--save", "{o}", *SYN], "unknown key", 2),
    (["train", "--config", "{f}/missing.yaml", "--save", "{o}", *SYN], "cannot read", 2),
    (["train", "--resume", "{f}/missing.pth", "--save", "{o}", *SYN], "no such file", 2),
    (["finetune", "--checkpoint", "{f}/random.pth", "--save", "{o}", *SYN], "corrupt", 2),
    (["eval", "--checkpoint", "{f}/evil.pth", *SYN], "refused", 2),
    (["stats", "--checkpoint", "{f}/good.pth", "--input-size", "3,32", "--cpu"], "C,H,W", 2),
    (["stats", "--checkpoint", "{f}/good.pth", "--compare", "{f}/truncated.pth", "--cpu"], "corrupt", 2),
    (["sweep", "--checkpoint", "{f}/good.pth", "--percents", "0.5:0.1:0.1", "--save", "{o}", *SYN],
     "--percents", 2),
    (["export", "--checkpoint", "{f}/good.pth", "--out", "{o}.bin"], ".pt2", 2),
    (["export", "--checkpoint", "{f}/good.pth", "--out", "{f}/good.pth", "--format", "torchscript"],
     "already exists", 2),
    (["report", "--run", "{f}/missing"], "no such run folder", 2),
    (["pipeline", "--save", "{o}", *SYN], "--percent", 2),
]


def snapshot(folder):
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize("argv,needle,code", CASES, ids=[f"{c[0][0]}-{c[1]}" for c in CASES])
def test_bad_input_is_one_line_and_touches_nothing(argv, needle, code, files, tmp_path, capsys):
    if "no CUDA device" in needle and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = tmp_path / "out"
    argv = [a.format(f=files, o=out) for a in argv]
    before = snapshot(files)
    try:
        got = main(argv)
    except SystemExit as e:  # argparse's own usage errors
        got = e.code
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert got == code, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert needle in lines[0]
    assert snapshot(files) == before  # nothing overwritten, nothing half-written
    assert not out.exists() and not (files / "pwned").exists()


def test_there_are_at_least_25_bad_input_cases():
    assert len(CASES) >= 25 and len({c[0][0] for c in CASES}) >= 8  # most commands covered


def test_fuzzed_checkpoints_fail_clearly_or_load_intact(files, tmp_path):
    """Random corruptions: each ends in CheckpointError, or loads exactly the original weights
    (the damage hit bytes that carry nothing); never another exception, never a hang."""
    data = (files / "good.pth").read_bytes()
    original = load_model(files / "good.pth").state_dict()
    rng = random.Random(1234)
    outcomes = {"error": 0, "intact": 0}
    path = tmp_path / "fuzz.pth"

    def timeout(*_):
        raise TimeoutError("load hung")

    old = signal.signal(signal.SIGALRM, timeout)
    try:
        for _ in range(200):
            b = bytearray(data)
            kind = rng.choice(["flip", "bytes", "zero", "truncate"])
            if kind == "flip":
                for _ in range(rng.randint(1, 4)):
                    pos = rng.randrange(len(b))
                    b[pos] ^= 1 << rng.randrange(8)
            elif kind == "bytes":
                pos = rng.randrange(len(b) - 8)
                b[pos:pos + 8] = rng.randbytes(8)
            elif kind == "zero":
                pos = rng.randrange(len(b))
                b[pos:pos + rng.randint(1, 512)] = bytes(len(b[pos:pos + 512]))[: len(b[pos:pos + 512])]
            else:
                b = b[: rng.randrange(len(b))]
            path.write_bytes(bytes(b))
            signal.alarm(10)
            try:
                loaded = load_model(path).state_dict()
            except CheckpointError as e:
                assert "\n" not in str(e)
                outcomes["error"] += 1
            else:
                assert all(torch.equal(loaded[k], v) for k, v in original.items())
                outcomes["intact"] += 1
            finally:
                signal.alarm(0)
    finally:
        signal.signal(signal.SIGALRM, old)
    assert outcomes["error"] > 150  # the checksum catches flipped weight bytes too


def test_checksum_catches_a_flipped_weight(files, tmp_path):
    ckpt = torch.load(files / "good.pth", weights_only=True)
    ckpt["state_dict"]["feature.0.weight"][0, 0, 0, 0] += 1e-3  # damage that still unpickles
    torch.save(ckpt, tmp_path / "damaged.pth")
    with pytest.raises(CheckpointError, match="checksum"):
        load_checkpoint(tmp_path / "damaged.pth")


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    from slimming.data import build_loaders

    train_loader, test_loader, _ = build_loaders("synthetic", batch_size=256, seed=0)
    model = models.build("vgg", cfg=TINY)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    trainer = Trainer(model, opt, make_scheduler(opt, 3), torch.device("cpu"))
    real = trainer.criterion
    calls = {"n": 0}

    def criterion(out, y):  # fine for epoch 1, then the loss turns to nan
        calls["n"] += 1
        return real(out, y) * (float("nan") if calls["n"] > len(train_loader) else 1.0)

    trainer.criterion = criterion
    with pytest.raises(TrainingError, match="non-finite"):
        trainer.fit(train_loader, test_loader, epochs=3, save_dir=tmp_path)
    ckpt = load_checkpoint(tmp_path / "last.pth")
    assert ckpt["epoch"] == 1
    assert all(torch.isfinite(v).all() for v in ckpt["state_dict"].values() if v.is_floating_point())
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 1


def test_model_without_bn_says_so(tmp_path):
    from slimming import prune

    plain = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3))
    with pytest.raises(ValueError, match="no prunable BatchNorm2d"):
        prune(plain, percent=0.5)


def test_deterministic_cpu_runs_are_bit_identical(tmp_path):
    argv = ["train", "--arch", "vgg", "--cfg", ",".join(map(str, TINY)), "--epochs", "2",
            "--sparsity", "1e-3", "--seed", "7", "--deterministic", "--save", str(tmp_path / "run"),
            "--batch-size", "128", "--overwrite", *SYN]  # the same arguments both times
    digests = []
    for _ in range(2):
        assert main(argv) == 0
        digests.append({n: hashlib.sha256((tmp_path / "run" / n).read_bytes()).hexdigest()
                        for n in ("last.pth", "best.pth")})
    assert digests[0] == digests[1]
    assert not torch.are_deterministic_algorithms_enabled()  # the process is left as found


def test_survives_repeated_kills(tmp_path):
    """SIGKILL at several random moments, --resume auto each time: the run ends with the
    requested epochs, and every checkpoint seen along the way loads."""
    save = tmp_path / "run"
    argv = [sys.executable, "-m", "slimming", "train", "--arch", "vgg", "--cfg", "8,M,8,M,8,M,8,M,8",
            "--epochs", "6", "--seed", "1", "--batch-size", "32", "--save", str(save), "--resume", "auto",
            *SYN]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    rng = random.Random(5)
    kills, loaded, done = 0, 0, 0

    def check_all() -> int:
        nonlocal loaded
        epoch = 0
        for name in ("last.pth", "best.pth"):
            if (save / name).exists():
                ckpt = load_checkpoint(save / name)  # raises if a kill ever left a broken file
                loaded += 1
                epoch = max(epoch, ckpt["epoch"] if name == "last.pth" else 0)
        return epoch

    for _ in range(3):
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None and check_all() <= done:
            time.sleep(0.05)  # wait for this process to finish one more epoch...
        time.sleep(rng.uniform(0.0, 0.3))  # ...then kill it somewhere in the next
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait()
        done = check_all()
    assert subprocess.run(argv, env=env, capture_output=True).returncode == 0
    assert load_checkpoint(save / "last.pth")["epoch"] == 6
    rows = [json.loads(x) for x in (save / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert kills >= 2 and loaded > 0
