"""Two processes on the CPU with the gloo backend, launched with torchrun; and who owns the
process group (one process, a world of one)."""

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.distributed as torch_dist

import slimming.training.distributed as sd

WORKER = textwrap.dedent("""
    import os, sys, torch
    import slimming.training.engine as engine
    from slimming.utils.modules import unwrap

    fit = engine.Trainer.fit

    def fit_and_dump(self, *args, **kwargs):
        result = fit(self, *args, **kwargs)
        torch.save(unwrap(self.model).state_dict(), os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.pt"))
        return result

    engine.Trainer.fit = fit_and_dump
    from slimming.cli import main
    sys.exit(main(sys.argv[2:]))
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(*argv: str, timeout: int = 120) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node 2 -m slimming ARGV`` on the CPU, one thread per rank."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
           "127.0.0.1", "--master_port", str(free_port()), "-m", "slimming", *argv]
    return subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                          text=True, timeout=timeout)


def checkpoint_files(save) -> list[str]:
    """What a run left in its --save folder, less hidden files (the run lock)."""
    return sorted(p.name for p in save.iterdir() if not p.name.startswith("."))


@pytest.mark.slow
def test_two_gloo_ranks_end_identical_with_one_checkpoint(tmp_path):
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    save = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(worker), str(tmp_path),
           "train", "--arch", "vgg", "--cfg", "8,M,16,M,16,M,16,M,16", "--dataset", "synthetic",
           "--epochs", "2", "--sparsity", "1e-3", "--seed", "0", "--cpu", "--batch-size", "64",
           "--sync-bn", "--save", str(save)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    r0 = torch.load(tmp_path / "rank0.pt", weights_only=True)
    r1 = torch.load(tmp_path / "rank1.pt", weights_only=True)
    for k in r0:
        if "running" in k or "num_batches" in k:
            continue  # per-process BN statistics (SyncBN is CUDA-only) may differ
        assert torch.equal(r0[k], r1[k]), k
    assert checkpoint_files(save) == ["best.pth", "last.pth", "metrics.jsonl"]
    assert len((save / "metrics.jsonl").read_text().splitlines()) == 2  # written by rank 0 only
    assert torch.load(save / "last.pth", weights_only=True)["epoch"] == 2
    assert "CUDA-only" in result.stdout + result.stderr
    assert result.stdout.count("best test accuracy") == 1


@pytest.mark.slow
def test_repeated_two_rank_runs_all_exit_cleanly(tmp_path):
    """Rank 1 used to abort now and then after a finished run ("terminate called without an
    active exception": gloo's worker thread freed the last all_reduce's tensor while the
    interpreter was exiting), so torchrun failed although the checkpoints were complete."""
    for i in range(5):
        save = tmp_path / f"run{i}"
        result = torchrun("train", "--arch", "vgg", "--cfg", "8,M,16,M,16,M,16,M,16", "--dataset",
                          "synthetic", "--epochs", "1", "--seed", "0", "--cpu", "--batch-size", "64",
                          "--save", str(save))
        out = result.stdout + result.stderr
        assert result.returncode == 0, f"run {i}: {out[-3000:]}"
        assert "terminate called" not in out and "ChildFailedError" not in out, f"run {i}: {out[-3000:]}"
        assert checkpoint_files(save) == ["best.pth", "last.pth", "metrics.jsonl"]
        assert torch.load(save / "last.pth", weights_only=True)["epoch"] == 1


@pytest.fixture
def world_of_one(monkeypatch):
    """What torchrun would set for a single process; leaves no group or owner behind."""
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    for k in ("RANK", "LOCAL_RANK"):
        monkeypatch.setenv(k, "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    barriers = []
    monkeypatch.setattr(sd, "barrier", lambda: barriers.append(torch_dist.is_initialized()))
    yield barriers
    if torch_dist.is_initialized():
        torch_dist.destroy_process_group()
    sd._owner = None


def test_without_torchrun_everything_is_a_no_op(monkeypatch):
    for k in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    sd.cleanup()  # no group: nothing to do, no error
    with sd.distributed_session(False) as info:
        assert info == sd.DistInfo() and not info.enabled
    assert not torch_dist.is_initialized()


def test_cleanup_destroys_what_init_distributed_created(world_of_one):
    info = sd.init_distributed(False)
    assert info.enabled and info.is_main and info.world_size == 1
    t = torch.ones(3)
    refs = t._use_count()
    assert torch.equal(sd.all_reduce_sum(t), torch.ones(3)) and t._use_count() == refs
    sd.cleanup()
    assert not torch_dist.is_initialized()
    assert world_of_one == [True]  # one barrier, while the group still existed
    sd.cleanup()  # twice is fine


def test_session_owns_the_group_across_commands(world_of_one):
    with sd.distributed_session(False) as outer:
        assert outer.enabled
        for _ in range(2):  # e.g. pipeline's train, then finetune
            assert sd.init_distributed(False) == outer
            sd.cleanup()  # not its group: a no-op
            assert torch_dist.is_initialized()
        with sd.distributed_session(False) as inner:  # nested: reuses, leaves it alone
            assert inner == outer
        assert torch_dist.is_initialized() and world_of_one == []
    assert not torch_dist.is_initialized()
    assert world_of_one == [True]


def test_session_leaving_on_an_error_skips_the_barrier(world_of_one):
    with pytest.raises(RuntimeError, match="stage failed"):
        with sd.distributed_session(False):
            raise RuntimeError("stage failed")
    assert not torch_dist.is_initialized() and world_of_one == []


def test_cleanup_during_an_error_skips_the_barrier(world_of_one):
    sd.init_distributed(False)
    with pytest.raises(ValueError):
        try:
            raise ValueError("bad epoch")
        finally:
            sd.cleanup()  # as in run_training's finally
    assert not torch_dist.is_initialized() and world_of_one == []


def test_a_group_made_elsewhere_is_left_alone(world_of_one, tmp_path):
    torch_dist.init_process_group("gloo", store=torch_dist.FileStore(str(tmp_path / "store"), 1),
                                  rank=0, world_size=1)
    with sd.distributed_session(False) as info:
        assert info.enabled
        sd.init_distributed(False)
        sd.cleanup()
    assert torch_dist.is_initialized() and world_of_one == []


@pytest.mark.slow
def test_the_pipeline_under_torchrun_prunes_and_reports_on_rank_0_only(tmp_path):
    """Every rank trains; rank 0 alone prunes, evaluates, writes the report and prints, and the
    other rank reads what it wrote (it used to race it: "no such file"). Twice in a row."""
    for i in range(2):
        root = tmp_path / f"pipe{i}"
        result = torchrun("pipeline", "--cfg", "8,M,16,M,16,M,16,M,16", "--dataset", "synthetic",
                          "--epochs", "1", "--finetune-epochs", "1", "--sparsity", "1e-2", "--percent",
                          "0.5", "--repeats", "0", "--seed", "0", "--cpu", "--batch-size", "128",
                          "--save", str(root), timeout=300)
        out = result.stdout + result.stderr
        assert result.returncode == 0, out[-3000:]
        assert "terminate called" not in out and "ChildFailedError" not in out
        for line in ("== [2/4] prune ==", "== [4/4] report ==", "saved", "top-1 accuracy",
                     "== [3/4] fine-tune =="):
            assert result.stdout.count(line) == 1, (line, result.stdout)
        assert json.loads((root / "pruned" / "eval.json").read_text())["count"] == 512  # whole test set
        assert torch.load(root / "finetuned" / "last.pth", weights_only=True)["epoch"] == 1
        assert (root / "report.md").exists()
        assert not [p for p in root.rglob("*") if ".tmp" in p.name]
