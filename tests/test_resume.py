"""Resume: --resume auto after a SIGKILL mid-epoch finishes the run, and ends where an
uninterrupted run ends; the save folder holds loadable checkpoints at every moment."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from slimming import load_checkpoint, save_checkpoint
from slimming.cli import main

# with the sparsity controller, which steers within epochs: a resumed run must steer as the
# uninterrupted one did (the strength and peak learning rate come back from last.pth)
BASE = ["train", "--arch", "vgg", "--cfg", "8,M,16,M,16,M,16,M,16", "--dataset", "synthetic",
        "--sparsity", "1e-3", "--sparsity-target", "0.5", "--cpu", "--batch-size", "32"]
TRAIN = [*BASE, "--epochs", "3", "--seed", "3"]


def weights(path):
    return torch.load(path, weights_only=True)["state_dict"]


def slimming(*argv, env):
    """Run the CLI in a fresh process (one thread, so that every run reduces in the same order)."""
    return subprocess.run([sys.executable, "-m", "slimming", *map(str, argv)], env=env,
                          capture_output=True, text=True).returncode


@pytest.mark.slow
def test_kill_and_resume_matches_uninterrupted(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    killed = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "slimming", *TRAIN, "--save", str(killed)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seen = 0
    deadline = time.monotonic() + 120
    try:  # wait for epoch 1's checkpoint, then kill during epoch 2
        while time.monotonic() < deadline and proc.poll() is None:
            if (killed / "last.pth").exists():
                for name in ("last.pth", "best.pth"):  # every file there loads, at any moment
                    if (killed / name).exists():
                        load_checkpoint(killed / name)
                        seen += 1
                if load_checkpoint(killed / "last.pth")["epoch"] >= 1:
                    time.sleep(0.3)
                    break
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    interrupted_at = load_checkpoint(killed / "last.pth")["epoch"]
    assert seen and interrupted_at < 3, "the run finished before it could be killed"
    assert slimming(*TRAIN, "--save", killed, "--resume", "auto", env=env) == 0
    assert load_checkpoint(killed / "last.pth")["epoch"] == 3
    rows = [json.loads(x) for x in (killed / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2, 3]
    assert not [p.name for p in killed.iterdir() if p.name.endswith(".tmp")]  # stale temps swept

    straight = tmp_path / "straight"
    assert slimming(*TRAIN, "--save", straight, env=env) == 0
    a, b = weights(killed / "last.pth"), weights(straight / "last.pth")
    for k in a:
        assert torch.equal(a[k], b[k]), k
    best_a = load_checkpoint(killed / "best.pth")["best_acc"]
    assert best_a == load_checkpoint(straight / "best.pth")["best_acc"]


def test_resume_auto_without_a_run_starts_fresh_and_finished_run_is_left_alone(tmp_path, capsys):
    save = tmp_path / "run"
    args = [*BASE, "--epochs", "1", "--seed", "0", "--save", str(save)]
    assert main([*args, "--resume", "auto"]) == 0
    first = (save / "last.pth").read_bytes()
    assert main([*args, "--resume", "auto"]) == 0  # all epochs done: nothing to redo
    assert "nothing to do" in capsys.readouterr().out
    assert (save / "last.pth").read_bytes() == first
    assert main(args) == 2  # no --resume, no --overwrite: refused
    assert "--resume auto" in capsys.readouterr().err
    assert (save / "last.pth").read_bytes() == first


@pytest.mark.slow
def test_resume_restores_best_accuracy(tmp_path, capsys):
    save = tmp_path / "run"
    base = [*BASE, "--seed", "0", "--save", str(save)]
    assert main([*base, "--epochs", "1"]) == 0
    ckpt = torch.load(save / "last.pth", weights_only=True)
    ckpt["best_acc"] = 99.5  # as if an earlier epoch had been that good
    save_checkpoint(ckpt, save / "last.pth")  # a new checksum for the edited contents
    assert main([*base, "--epochs", "2", "--resume", str(save / "last.pth")]) == 0
    assert load_checkpoint(save / "last.pth")["best_acc"] == pytest.approx(99.5)
