"""Promises about processes and the files they share: one run per folder (a lock that names its
holder and dies with it), planted symlinks never written through, SIGTERM/SIGINT leaving no
temporary file, and a damaged decode cache rebuilt by the next run. What needs a process of its
own (the lock's holder, a signalled command) runs in one; the runs that only meet its files run
in this process (``cli``), which spares a torch import each."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from conftest import randomize_bn

from slimming import checkpoint_dict, load_checkpoint, models, save_checkpoint

TINY = "8,M,16,M,16,M,16,M,16"
SYN = ["--dataset", "synthetic", "--cpu", "--batch-size", "256"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def cli(capsys, *argv) -> subprocess.CompletedProcess:
    """``slimming ARGV`` in this process: its exit code, stdout and stderr, as a process gives them."""
    from slimming.cli import main

    capsys.readouterr()
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(argv, code, out, err)


def temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if ".tmp" in p.name)


def interruptible() -> None:
    """In the child, before it starts: SIGINT as a terminal delivers it. A suite started in the
    background of a script inherits SIGINT ignored (the shell's rule for background jobs), and a
    Python started so never raises KeyboardInterrupt: the ^C these tests send would do nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for(predicate, proc, seconds=300.0) -> None:  # a hang, on a busy machine too
    deadline = time.monotonic() + seconds
    while not predicate():
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "model.pth"
    model = models.build("vgg", cfg=[8, "M", 16, "M", 16, "M", 16, "M", 16])
    randomize_bn(model, torch.Generator().manual_seed(0))
    save_checkpoint(checkpoint_dict(model, acc=10.0), path)
    return path


# --------------------------------------------------------------------------- one run per folder

@pytest.mark.slow
def test_a_second_run_on_a_folder_in_use_is_refused_and_the_lock_dies_with_its_holder(
        tmp_path, checkpoint, capsys):
    save = tmp_path / "run"
    first = subprocess.Popen([sys.executable, "-m", "slimming", "train", "--cfg", TINY, "--epochs",
                              "1000", "--save", str(save), *SYN], env=ENV,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (save / "last.pth").exists(), first)  # mid-run, lock held
        for argv in (["train", "--cfg", TINY, "--resume", "auto"],
                     ["finetune", "--checkpoint", checkpoint]):
            refused = cli(capsys, *argv, "--epochs", 1, "--save", save, *SYN)
            lines = refused.stderr.strip().splitlines()
            assert refused.returncode == 2 and len(lines) == 1, refused.stderr
            assert f"in use by process {first.pid}" in lines[0]
    finally:
        first.kill()  # SIGKILL: nothing of slimming's runs, only the kernel drops the lock
        first.wait()
    after = cli(capsys, "train", "--cfg", TINY, "--resume", "auto", "--epochs", 1, "--save", save, *SYN)
    assert after.returncode == 0, after.stderr  # the dead holder's lock is no obstacle
    assert "nothing to do" in after.stdout


# --------------------------------------------------------------------------- planted symlinks

@pytest.mark.slow
def test_symlinks_planted_at_outputs_are_replaced_never_written_through(tmp_path, checkpoint, capsys):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    run, pruned, out = tmp_path / "run", tmp_path / "pruned", tmp_path / "export"
    for folder, name in ((run, "metrics.jsonl"), (pruned, "pruned.pth"), (out, "model.pt2")):
        folder.mkdir()
        (folder / name).symlink_to(victim)
    assert cli(capsys, "train", "--cfg", TINY, "--epochs", 1, "--save", run, *SYN).returncode == 0
    assert cli(capsys, "prune", "--checkpoint", checkpoint, "--percent", "0.5", "--save", pruned,
               "--overwrite", "--cpu").returncode == 0
    assert cli(capsys, "export", "--checkpoint", checkpoint, "--out", out / "model.pt2", "--overwrite",
               "--cpu").returncode == 0
    assert victim.read_text() == "precious\n"
    for path in (run / "metrics.jsonl", pruned / "pruned.pth", out / "model.pt2"):
        assert path.is_file() and not path.is_symlink()
    assert json.loads((run / "metrics.jsonl").read_text())["epoch"] == 1
    load_checkpoint(pruned / "pruned.pth")
    # without --overwrite, a symlink (even a dangling one) counts as an existing output
    (pruned / "pruned.pth").unlink()
    (pruned / "pruned.pth").symlink_to(tmp_path / "nowhere")
    refused = cli(capsys, "prune", "--checkpoint", checkpoint, "--percent", "0.5", "--save", pruned, "--cpu")
    assert refused.returncode == 2 and "already exists" in refused.stderr
    assert not (tmp_path / "nowhere").exists()


def test_a_symlink_planted_at_the_lock_is_refused(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / ".slimming.lock").symlink_to(tmp_path / "elsewhere")
    result = cli(capsys, "train", "--cfg", TINY, "--epochs", 1, "--save", run, *SYN)
    assert result.returncode == 2 and "symlink" in result.stderr
    assert not (tmp_path / "elsewhere").exists()


# --------------------------------------------------------------------------- signals

# Runs a command with every atomic rename slowed down: the signal arrives while a finished
# temporary file waits to replace its target, the worst moment for leaving one behind.
SLOW_RENAME = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path

    real = os.replace
    def slow_replace(src, dst):
        # the marker appears whole (a signal sent as soon as it exists finds its text written)
        Path(sys.argv[1] + ".part").write_text(str(dst))
        real(sys.argv[1] + ".part", sys.argv[1])
        time.sleep(60)
        real(src, dst)
    os.replace = slow_replace
    from slimming.cli import main
    sys.exit(main(sys.argv[2:]))
""")


@pytest.fixture(scope="module")
def pipeline_run(tmp_path_factory):
    from slimming.cli import main

    root = tmp_path_factory.mktemp("pipe") / "run"
    assert main([str(a) for a in ("pipeline", "--cfg", TINY, "--epochs", 1, "--finetune-epochs", 1,
                                  "--percent", "0.5", "--sparsity", "1e-2", "--repeats", 0,
                                  "--save", root, *SYN)]) == 0
    return root


@pytest.mark.parametrize("command,sig", [
    ("train", signal.SIGTERM), ("train", signal.SIGINT), ("prune", signal.SIGTERM),
    ("prune", signal.SIGINT), ("export", signal.SIGTERM), ("sweep", signal.SIGTERM),
    ("report", signal.SIGTERM),
])
@pytest.mark.slow
def test_a_signal_mid_write_leaves_no_temporary_file(tmp_path, checkpoint, pipeline_run, command, sig):
    out = tmp_path / "out"
    argv = {
        "train": ["train", "--cfg", TINY, "--epochs", 2, "--save", out, *SYN],
        "prune": ["prune", "--checkpoint", checkpoint, "--percent", "0.5", "--save", out, "--cpu"],
        "export": ["export", "--checkpoint", checkpoint, "--out", out / "m.pt2", "--cpu"],
        "sweep": ["sweep", "--checkpoint", checkpoint, "--percents", "0.5", "--save", out, *SYN],
        "report": ["report", "--run", out, "--repeats", 0, "--cpu"],
    }[command]
    if command == "report":  # a finished run to report on, copied so the original stays clean
        subprocess.run(["cp", "-r", str(pipeline_run), str(out)], check=True)
        before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    (tmp_path / "slow.py").write_text(SLOW_RENAME)
    marker = tmp_path / "renaming"
    proc = subprocess.Popen([sys.executable, str(tmp_path / "slow.py"), str(marker), *map(str, argv)],
                            env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=interruptible)
    wait_for(marker.exists, proc)
    assert temporaries(out)  # the finished temporary file is there, waiting to be renamed
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == (130 if sig == signal.SIGINT else 128 + sig), err
    assert "Traceback" not in err and err.strip().splitlines()[-1].endswith(
        "interrupted" if sig == signal.SIGINT else f"stopped by signal {int(sig)}")
    assert temporaries(out) == []
    target = Path(marker.read_text())
    assert not target.exists() or command == "report"  # the first write never happened
    if command == "report":
        assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


@pytest.mark.slow
def test_a_run_started_under_nohup_outlives_its_terminal(tmp_path, checkpoint):
    """``nohup slimming prune ... &``: SIGHUP was ignored when the process started and stays
    ignored (the handler that cleans up on SIGTERM once replaced nohup's ignore: exit 129)."""
    script = SLOW_RENAME.replace("time.sleep(60)", "time.sleep(1)")
    (tmp_path / "slow.py").write_text(script)
    marker, out = tmp_path / "renaming", tmp_path / "out"

    def like_nohup():
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    argv = ["prune", "--checkpoint", checkpoint, "--percent", "0.5", "--save", out, "--cpu"]
    proc = subprocess.Popen([sys.executable, str(tmp_path / "slow.py"), str(marker), *map(str, argv)],
                            env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=like_nohup)
    wait_for(marker.exists, proc)
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert (out / "pruned.pth").exists() and temporaries(out) == []


# --------------------------------------------------------------------------- the decode cache

def test_a_damaged_decode_cache_is_rebuilt_by_the_next_run(tmp_path, capsys, monkeypatch):
    from PIL import Image

    g = torch.Generator().manual_seed(0)
    for split in ("train", "test"):
        for c in ("a", "b"):
            (tmp_path / "data" / split / c).mkdir(parents=True)
            for i in range(4):
                pixels = torch.randint(0, 256, (32, 32, 3), generator=g, dtype=torch.uint8)
                Image.fromarray(pixels.numpy()).save(tmp_path / "data" / split / c / f"{i}.png")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    def train(save):
        return cli(capsys, "train", "--cfg", TINY, "--epochs", "1", "--dataset", "imagefolder",
                   "--data-root", tmp_path / "data", "--cpu", "--save", tmp_path / save)

    first = train("a")
    assert first.returncode == 0 and "decoded 16 images" in first.stderr, first.stderr
    (cache,) = (tmp_path / "cache").rglob("imagefolder-*.pt")
    data = bytearray(cache.read_bytes())
    data[len(data) // 2] ^= 0xFF  # a flipped byte in the pixels
    cache.write_bytes(bytes(data))
    second = train("b")
    assert second.returncode == 0, second.stderr
    assert "invalid and is being rebuilt" in second.stderr and "decoded 16 images" in second.stderr
    third = train("c")
    assert third.returncode == 0 and "decoded" not in third.stderr  # the rebuilt cache is used
