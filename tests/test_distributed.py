"""Two processes on the CPU with the gloo backend, launched with torchrun."""

import os
import socket
import subprocess
import sys
import textwrap

import torch

WORKER = textwrap.dedent("""
    import os, sys, torch
    import slimming.engine as engine
    from slimming.prune import unwrap

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
    assert sorted(p.name for p in save.iterdir()) == ["best.pth", "last.pth", "metrics.jsonl"]
    assert len((save / "metrics.jsonl").read_text().splitlines()) == 2  # written by rank 0 only
    assert torch.load(save / "last.pth", weights_only=True)["epoch"] == 2
    assert "CUDA-only" in result.stdout + result.stderr
    assert result.stdout.count("best test accuracy") == 1
