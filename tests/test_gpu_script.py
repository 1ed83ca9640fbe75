"""benchmarks/gpu/run.py, the one command for a lent GPU machine, run here with --smoke: every
step, tiny, on the CPU, so that the GPU's minutes are not spent finding its bugs."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import slimming

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu" / "run.py"


def run(*args: str) -> subprocess.CompletedProcess:
    """The smoke run with a budget no machine runs short of (the smoke's own 150 s sizes its
    steps and epochs to the time left: on a busy machine a step was stopped, an epoch dropped),
    so that what it does never depends on how fast the machine is; the timeout only catches a
    hang."""
    done = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--no-install", "--budget-s", "3000",
                           *map(str, args)], cwd=REPO, capture_output=True, text=True, timeout=3000)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """One smoke run of every step (about 30 s on 2 cores)."""
    out = tmp_path_factory.mktemp("gpu") / "out"
    run("--out", out)
    return out, json.loads((out / "results.json").read_text())


@pytest.mark.slow
def test_every_step_runs_and_reports(smoke):
    out, results = smoke
    assert (out / "run.log").stat().st_size > 0 and "done in" in (out / "run.log").read_text()
    steps = results["steps"]
    assert set(steps) == {"correctness", "throughput", "paper"}
    assert {k: s["status"] for k, s in steps.items()} == dict.fromkeys(steps, "ok"), \
        {k: s.get("log_tail") for k, s in steps.items()}
    assert all(0 < s["seconds"] <= s["budget_s"] for s in steps.values())
    assert results["data"]["kind"] in ("pack", "folder (slimming.data.packed not available: the folder "
                                                "itself is the data)")
    counts = steps["correctness"]["counts"]
    if not torch.cuda.is_available():  # every CUDA test collected, and skipped
        assert counts.get("skipped", 0) >= 10 and not counts.get("passed") and not counts.get("failed")
        assert steps["correctness"]["failures"] == []


@pytest.mark.slow
def test_throughput_figures(smoke):
    fig = smoke[1]["steps"]["throughput"]["figures"]
    assert "errors" not in fig and "not_run" not in fig, (fig.get("errors"), fig.get("not_run"))
    names = ("fp32", "bf16", "bf16-cl", "bf16-cl-compile")
    assert set(fig["train"]) == {f"{n}@{b}" for n in names for b in (8, 16)}
    for f in fig["train"].values():
        assert f["images_per_s"] > 0 and f["finite"] and f["steps"] >= 5 and f["warmup_s"] > 0
    lat = fig["latency_ms"]
    assert lat["params"][1] < lat["params"][0] and lat["flops"][1] < lat["flops"][0]
    assert all(lat[f"batch_{b}"]["before"] > 0 and lat[f"batch_{b}"]["after"] > 0 for b in (1, 8, 16))
    loader = fig["loader"]
    assert loader["fast_alone_images_per_s"] > 0 and loader["torchvision_alone_images_per_s"] > 0
    assert loader["torchvision_training_bf16-cl@8"]["images_per_s"] > 0
    assert fig["train_images"] == 640 and fig["num_classes"] == 10


@pytest.mark.slow
def test_paper_row_figures_and_files(smoke):
    out, results = smoke
    fig = results["steps"]["paper"]["figures"]
    plan = fig["plan"]
    assert plan["epochs"] == 2 and plan["finetune_epochs"] == 2 and plan["epoch_s"] > 0
    assert fig["flags"] == [] and "fp32" in fig["flags_why"]
    # the probe is stopped after its first epoch; on a busy machine it may finish a second
    assert 1 <= fig["sparse"]["epochs_done"] <= 2 and fig["finetune"]["epochs_done"] == 2
    prune = fig["prune"]
    assert prune["rc"] == 0 and prune["params_after"] < prune["params_before"]
    assert prune["flops_after"] < prune["flops_before"] and 0 <= prune["acc_right_after"] <= 100
    summary = fig["summary"]
    assert all(0 <= summary[k] <= 100 for k in ("error_sparse", "error_pruned", "error_finetuned"))
    assert summary["params"] == [prune["params_before"], prune["params_after"]]
    assert "fine-tune epochs" in fig["schedule"] and "160 + 160" in fig["schedule"]
    top = {p.name for p in out.iterdir() if p.is_file()}
    assert top == {"results.json", "run.log", "pruned.pth", "finetuned.pth"}  # what comes back: <= 8
    pruned, tuned = (slimming.load_model(out / n) for n in ("pruned.pth", "finetuned.pth"))
    assert pruned.cfg == tuned.cfg and slimming.count_params(tuned) == prune["params_after"]


@pytest.mark.slow
def test_resume_warm_and_from_what_came_back(smoke, tmp_path):
    """A rerun on the same work folder redoes nothing; ``--state`` (a copy of what came back, on
    a fresh machine) keeps the earlier figures and fine-tunes the pruned.pth it holds anew."""
    out, results = smoke
    run("--out", tmp_path / "warm", "--work", out / "work", "--steps", "paper")
    warm = json.loads((tmp_path / "warm" / "results.json").read_text())["steps"]
    paper = warm["paper"]["figures"]
    assert paper["sparse"] == results["steps"]["paper"]["figures"]["sparse"]
    assert paper["finetune"]["epochs_done"] == 2
    assert "nothing to do" in (tmp_path / "warm" / "run.log").read_text()
    assert warm["throughput"]["from_previous_run"]  # kept, not rerun

    run("--out", tmp_path / "cold", "--work", tmp_path / "fresh", "--state", out, "--steps", "paper")
    cold = json.loads((tmp_path / "cold" / "results.json").read_text())["steps"]
    paper = cold["paper"]["figures"]
    assert "resumed_from" in paper and cold["correctness"]["from_previous_run"]
    assert paper["prune"] == results["steps"]["paper"]["figures"]["prune"]
    assert paper["finetune"]["epochs_done"] == paper["plan"]["finetune_epochs"] >= 1
    assert not (tmp_path / "fresh" / "paper" / "sparse").exists()  # no sparsity training redone


@pytest.mark.slow
def test_a_step_over_its_budget_is_stopped_with_everything_it_started(tmp_path):
    """run_cmd, which runs each step: past its timeout the step's whole process group goes (a
    grandchild too); asked to stop, it stops at once and is not counted as a timeout."""
    import importlib.util
    import os
    import time

    spec = importlib.util.spec_from_file_location("gpu_run", SCRIPT)
    gpu_run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_run)
    pid_file, log = tmp_path / "pid", tmp_path / "log"
    code = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; "
            f"time.sleep(120)']); open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(120)")
    start = time.time()
    r = gpu_run.run_cmd([sys.executable, "-c", code], 6, log)
    assert r["timed_out"] and time.time() - start < 100 and log.read_text().startswith("$ ")  # not 120
    grandchild = int(pid_file.read_text())
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            state = Path(f"/proc/{grandchild}/stat").read_text().split(")")[-1].split()[0]
        except OSError:
            break  # gone
        if state == "Z":  # dead, waiting for a parent to reap it
            break
        time.sleep(0.1)
    else:
        os.kill(grandchild, 9)
        raise AssertionError("the step's grandchild outlived it")
    r = gpu_run.run_cmd([sys.executable, "-c", "import time; time.sleep(120)"], 60, log, stop=lambda: True)
    assert not r["timed_out"] and r["seconds"] < 100  # not the 120 s it would sleep
