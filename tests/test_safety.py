"""Nothing lost: corrupt files, kills, numerical trouble and determinism. (The table of hostile
and mistaken inputs is tests/test_hostile.py; real-process cases are tests/test_processes.py.)"""

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

from slimming import CheckpointError, checkpoint_dict, load_checkpoint, load_model, models, save_checkpoint
from slimming.cli import main
from slimming.training.engine import Trainer, TrainingError, make_scheduler

TINY = [8, "M", 16, "M", 16, "M", 16, "M", 16]
SYN = ["--dataset", "synthetic", "--cpu"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("files")
    model = models.build("vgg", cfg=TINY)
    randomize_bn(model, torch.Generator().manual_seed(0))
    save_checkpoint(checkpoint_dict(model, acc=10.0), d / "good.pth")
    return d


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


@pytest.mark.slow
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
    with pytest.raises(ValueError, match="no (prunable )?BatchNorm"):
        prune(plain, percent=0.5)


@pytest.mark.slow
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


@pytest.mark.slow
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
