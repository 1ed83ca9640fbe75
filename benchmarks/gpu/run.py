"""One command for a lent GPU machine: the CUDA tests, training throughput, the paper's VGG-19 row.

    python benchmarks/gpu/run.py --out $OUT                      # all steps, 540 s in all
    python benchmarks/gpu/run.py --smoke --no-install --out DIR  # every step, tiny, on this CPU

Each step is a subprocess with a budget (its share of the time left); one that runs over is
killed with its process group, recorded as "timeout", and the next step starts. Figures go to
OUT/results.json, rewritten atomically as each figure or stage comes in, so a kill keeps them;
OUT/run.log has all output.

  correctness  ``pytest -m cuda``: passed/failed/skipped counts and the failing tests.
  throughput   images/s of VGG-19 sparsity training (``engine.Trainer.step``, ``--sparsity 1e-4``,
               the fast loader) at batch 64 and 256: fp32, bf16, bf16 + channels-last, and that
               + torch.compile. Warm-up steps (compilation, cuDNN's choices) are timed apart
               (``warmup_s``); the figure is the steps after them, between synchronisations.
               Then the fast loader against ``--loader torchvision`` (on the pack unpacked), and
               forward latency of VGG-19 before/after a 70% prune (``stats.latency_ms``).
  paper        ``slimming train --sparsity 1e-4`` -> ``prune --percent 0.7`` -> ``finetune``, with
               the setting of step 2 that fits the most epochs (or ``--paper-flags``).

Epochs: the sparse run starts as a 160-epoch run, stopped once 2 epochs have ended (a probe):
its first epoch carries compilation, the gap between the two epochs' ends is the real cost of
an epoch e (train, test, checkpoints), and what came before is the start-up cost o. N, the
epochs of both stages (the paper: 160 + 160), is the largest with 4o + 10 + 2 compile + (2N - 2)e
within the time left; the probe is continued with ``--resume auto --epochs N`` (its learning
rates are N's when N >= 6). After pruning, the fine-tune gets the epochs then left (at most N).

What comes back, resuming. Only OUT returns (8 files of <= 16 MiB): results.json, run.log,
pruned.pth (70% of VGG-19: ~9 MB) and finetuned.pth (weights only). The sparse run's last.pth
(~160 MB with momentum) cannot, so the runs live in ``--work`` (runs/gpu-work, git-ignored):
rerun on a machine still warm, the same command resumes each run exactly (the plan in
work/paper/plan.json keeps N). On a fresh machine, copy the OUT that came back into the repo
(gpu-state/, carried: *.pth is git-ignored) and pass ``--state gpu-state``: its figures are
kept and the paper step fine-tunes its pruned.pth anew, sized to the new budget.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]
STEPS = ("correctness", "throughput", "paper")
BF16 = ["--amp", "--amp-dtype", "bfloat16"]
CONFIGS = {"fp32": [], "bf16": BF16, "bf16-cl": [*BF16, "--channels-last"],
           "bf16-cl-compile": [*BF16, "--channels-last", "--compile"]}
TINY_CFG = "8,M,16,M,16,M,16,M,16"
PAPER = {"error_before": 6.34, "error_after": 6.20, "params_before": 20.04e6, "params_after": 2.30e6,
         "flops_before": 7.97e8, "flops_after": 3.91e8}
RETURN_LIMIT = 16 * 2**20
RUNNING: list[int] = []  # the process groups of the steps running now (one at most)


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)


def run_cmd(cmd: list, timeout: float, log: Path, capture: Path | None = None, stop=None,
            group: bool = True) -> dict:
    """Run ``cmd`` in the repo root, output appended to ``log`` (or written to ``capture``, then
    appended). Past ``timeout`` s, or once ``stop()`` (asked every 0.05 s) says so, it gets
    SIGTERM, then SIGKILL: with ``group`` (a step), its whole process group, made for it (in
    this session: whatever ends the session ends it), so that a step's own commands
    (``group=False``: in the step's group) go with it."""
    cmd = [str(c) for c in cmd]
    with open(log, "a") as f:
        f.write(f"$ {' '.join(cmd)}  (timeout {timeout:.0f} s)\n")
    if timeout < 5:
        return {"rc": None, "timed_out": True, "seconds": 0, "why": "no time left"}
    start, stopped = time.time(), False
    with open(capture or log, "w" if capture else "a") as f:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT,
                                preexec_fn=os.setpgrp if group else None)
        RUNNING.extend([proc.pid] if group else [])
        while proc.poll() is None and time.time() - start < timeout and not stopped:
            time.sleep(0.05 if stop else 0.2)
            stopped = bool(stop and stop())
        timed_out = proc.poll() is None and not stopped
        for sig in (signal.SIGTERM, signal.SIGKILL) if proc.poll() is None else ():
            try:
                os.killpg(proc.pid, sig) if group else proc.send_signal(sig)
                proc.wait(timeout=15)
                break
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        if group:
            RUNNING.remove(proc.pid)
    if capture:
        with open(log, "a") as f:
            f.write(capture.read_text(errors="replace"))
    return {"rc": proc.poll(), "timed_out": timed_out, "seconds": round(time.time() - start, 2)}


def slimming(*argv, timeout: float, log: Path, **kw) -> dict:
    return run_cmd([sys.executable, "-m", "slimming", *argv], timeout, log, group=False, **kw)


# --------------------------------------------------------------------------- step 1: correctness

def correctness(a, budget: float) -> dict:
    """``pytest -m cuda`` in one process (``-o addopts=`` drops pytest.ini's workers, and needs no
    pytest-xdist on the GPU machine): the counts of its last line, the failing tests."""
    out, where = a.work / "pytest.out", ["tests/test_cuda.py"] if a.smoke else []  # smoke: the parsing
    r = run_cmd([sys.executable, "-m", "pytest", "-o", "addopts=", "-m", "cuda", "-p", "no:cacheprovider",
                 "--durations=8", *where], budget, a.log, out)
    text = out.read_text(errors="replace")
    last = [line for line in text.splitlines() if re.search(r"\d+ (passed|failed|skipped|deselected)", line)]
    r["counts"] = {k.replace("errors", "error"): int(n) for n, k in re.findall(
        r"(\d+) (passed|failed|skipped|deselected|errors?|xfailed|xpassed)", last[-1] if last else "")}
    r["failures"] = re.findall(r"^(?:FAILED|ERROR) (\S+)", text, re.M)[:40]
    r["status"] = "timeout" if r["timed_out"] else {0: "ok", 1: "failed"}.get(r["rc"], "error")
    return r


# --------------------------------------------------------------------------- step 2: throughput

def throughput(a, part: Path) -> None:
    import torch

    import slimming as sl
    from slimming import models
    from slimming.data import build_loaders
    from slimming.data.loaders import TensorLoader
    from slimming.training.engine import Trainer, make_optimizer, make_scheduler

    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    net = {"cfg": [v if v == "M" else int(v) for v in TINY_CFG.split(",")]} if a.smoke else {"depth": 19}
    batches, measure_s, warm, probe = ((8, 16), 0.05, 1, 2) if a.smoke else ((64, 256), 3.0, 5, 10)
    fast, _, ncls = build_loaders("imagefolder", a.data, batches[0], seed=0, loader="fast", device=dev)
    fig = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
           "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version() if cuda else None,
           "model": f"VGG {TINY_CFG if a.smoke else 19}, SGD, --sparsity 1e-4", "train": {},
           "train_images": fast.dataset_size, "num_classes": ncls}

    def endless(loader, batch: int):
        for epoch in range(10**6):
            loader.set_epoch(epoch)
            full = 0
            for x, y in loader:
                if len(y) == batch:  # one shape: no recompiles
                    full += 1
                    yield x, y
            if not full:
                raise ValueError(f"no batch of {batch} images in an epoch")

    def rate(flags: list, batch: int, loader=None) -> dict:
        """Images/s of ``Trainer.step`` after ``warm`` + ``probe`` steps, over about measure_s."""
        torch.manual_seed(0)
        model = models.build("vgg", num_classes=ncls, **net).to(dev)
        cl = "--channels-last" in flags
        model = model.to(memory_format=torch.channels_last) if cl else model
        opt, step_net = make_optimizer(model), model
        if "--compile" in flags:
            torch._dynamo.reset()
            step_net = torch.compile(model, backend="eager" if a.smoke else "inductor")
        trainer = Trainer(step_net, opt, make_scheduler(opt, 1), dev, sparsity=sl.BNSparsity(model, 1e-4),
                          amp_dtype=torch.bfloat16 if "--amp" in flags else None, channels_last=cl)
        it = endless(loader or TensorLoader(fast.images, fast.labels, batch, train=True, mean=fast.info.mean,
                                            std=fast.info.std, seed=0, device=dev), batch)
        model.train()

        def steps(n: int) -> tuple[float, float]:
            sync()
            start = time.perf_counter()
            for _ in range(n):
                x, y = next(it)
                x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
                loss = trainer.step(x.contiguous(memory_format=torch.channels_last) if cl else x, y)[0]
            sync()
            return time.perf_counter() - start, float(loss)

        warm_s, probe_s = steps(warm)[0], steps(probe)[0]
        n = max(5, min(2000, int(measure_s * probe / probe_s)))
        seconds, loss = steps(n)
        return {"images_per_s": round(n * batch / seconds, 1), "steps": n, "seconds": round(seconds, 3),
                "warmup_s": round(warm_s + probe_s, 2), "loss": loss, "finite": math.isfinite(loss)}

    def loaders() -> dict:
        folder = a.data if a.data.is_dir() else a.work / "folder"  # the DataLoader reads files
        if not folder.exists():
            unpack(a.data, folder)
        slow, _, _ = build_loaders("imagefolder", folder, batches[0], workers=a.workers, seed=0,
                                   pin_memory=cuda, loader="torchvision")
        out = {"workers": a.workers}
        for name, loader in (("fast", fast), ("torchvision", slow)):
            it, seen = endless(loader, batches[0]), 0
            next(it)
            start = time.perf_counter()
            while time.perf_counter() - start < measure_s:
                seen += len(next(it)[0].to(dev, non_blocking=True))
            sync()
            out[f"{name}_alone_images_per_s"] = round(seen / (time.perf_counter() - start), 1)
        out[f"torchvision_training_bf16-cl@{batches[0]}"] = rate(CONFIGS["bf16-cl"], batches[0], slow)
        return out

    def record(into: dict, key: str, fn, need: float = 5) -> None:
        if time.time() > a.deadline - need:  # not started without the time it needs
            fig.setdefault("not_run", []).append(key)
        else:
            try:
                into[key] = fn()
            except Exception as e:  # recorded; the next figure is still measured
                fig.setdefault("errors", {})[key] = f"{type(e).__name__}: {str(e)[:300]}"
        write_json(part, fig)

    for name in ("fp32", "bf16", "bf16-cl"):  # cheapest first: a timeout keeps what was measured
        for b in batches:
            record(fig["train"], f"{name}@{b}", lambda f=CONFIGS[name], b=b: rate(f, b))
    record(fig, "latency_ms", lambda: latency(a, dev, net, ncls, batches))
    compiled, need = CONFIGS["bf16-cl-compile"], 5 if a.smoke else 90  # inductor: about a minute
    record(fig["train"], f"bf16-cl-compile@{batches[0]}", lambda: rate(compiled, batches[0]), need)
    record(fig, "loader", loaders, 5 if a.smoke else 40)
    record(fig["train"], f"bf16-cl-compile@{batches[1]}", lambda: rate(compiled, batches[1]), need)


def unpack(pack_path: Path, folder: Path) -> None:
    """The pack's JPEG files written back as an ImageFolder (for ``--loader torchvision``)."""
    from slimming.data.packed import read_pack

    pack = read_pack(pack_path)  # validated; its images are the bytes right after ``prefix``
    with open(pack_path, "rb") as f:
        f.seek(len(pack.prefix))
        data = f.read(int(pack.offsets[-1]))
    for i, label in enumerate(pack.labels.tolist()):
        d = folder / ("train" if i < pack.train else pack.test_split) / pack.classes[label]
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{i}.jpg").write_bytes(data[pack.offsets[i]:pack.offsets[i + 1]])


def latency(a, dev, net: dict, ncls: int, batches: tuple[int, int]) -> dict:
    """Forward latency (ms) of the network before and after a 70% prune, at batch 1 and ``batches``."""
    import slimming as sl
    from slimming import models
    from slimming.measure.stats import latency_ms

    sparse = a.work / "paper" / "sparse" / "best.pth"
    if sparse.exists():
        model, source = sl.load_model(sparse, dev), str(sparse)
    else:
        from common import sparsity_shaped

        model, source = models.build("vgg", num_classes=ncls, **net), "sparsity_shaped: 70% of gammas ~0"
        sparsity_shaped(model, small=0.7)
        model = model.to(dev).eval()
    pruned = sl.prune(model, percent=0.7).model.eval()
    out = {"source": source, "params": [sl.count_params(model), sl.count_params(pruned)],
           "flops": [sl.count_flops(model), sl.count_flops(pruned)]}
    for b in (1, *batches):
        before, after = (latency_ms(m, b, warmup=2 if a.smoke else 10, repeats=2 if a.smoke else 50)
                         for m in (model, pruned))
        out[f"batch_{b}"] = {"before": round(before, 4), "after": round(after, 4),
                             "speedup": round(before / after, 3)}
    return out


# --------------------------------------------------------------------------- step 3: the paper's row

def metrics(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def choose_flags(a, results: dict, batch: int, seconds: float) -> tuple[list[str], str]:
    """The setting of step 2 that fits the most epochs in ``seconds``: three processes (probe,
    continuation, fine-tune) each pay its warm-up (x4 under --compile: train and eval graphs,
    and each one's smaller last batch), then train at its images/s. A setting whose CUDA test
    failed (compile, bfloat16, channels_last in the test's id) is left out. The smoke trains in
    fp32 whatever it finds: a CPU's bf16 is emulated, seconds an epoch."""
    if a.paper_flags is not None:
        return a.paper_flags.split(), "given with --paper-flags"
    steps = results.get("steps", {})
    thr = steps.get("throughput", {}).get("figures", {})
    failed = " ".join(steps.get("correctness", {}).get("failures", []))
    fits = {}
    for name, flags in CONFIGS.items():
        f = thr.get("train", {}).get(f"{name}@{batch}")
        broken = any(flag in flags and word in failed for word, flag in (
            ("compile", "--compile"), ("bfloat16", "--amp"), ("channels_last", "--channels-last")))
        if f and f["finite"] and not broken:
            warm = 3 * f["warmup_s"] * (4 if "--compile" in flags else 1)
            fits[name] = (seconds - warm) * f["images_per_s"] / thr.get("train_images", 50000)
    best = max(fits, key=fits.get) if fits else "bf16-cl"
    why = (f"{best}: most epochs in {seconds:.0f} s (" + ", ".join(f"{k} {v:.1f}" for k, v in fits.items())
           + ")" if fits else "no throughput figures: bf16 + channels-last assumed")
    return ([], f"fp32 (the smoke; on a GPU: {why})") if a.smoke else (CONFIGS[best], why)


def accuracy(rows: list[dict]) -> dict:
    accs = [row["test_acc"] for row in rows]
    return {"epochs_done": len(rows), "best_acc": max(accs, default=None), "last_acc": (accs or [None])[-1],
            "error": round(100 - max(accs), 2) if accs else None,
            "epoch_seconds": [r["seconds"] for r in rows]}


def paper(a, part: Path) -> int:
    """The paper's row; 1 if a stage failed (a stage cut short by the time left is no failure)."""
    work = a.work / "paper"
    names = ("sparse", "pruned/pruned.pth", "finetune", "plan.json")
    sparse, pruned, ft, plan_file = (work / n for n in names)
    pruned.parent.mkdir(parents=True, exist_ok=True)
    results = json.loads(a.results.read_text()) if a.results.exists() else {}
    old = results.get("steps", {}).get("paper", {}).get("figures", {})
    batch = 8 if a.smoke else 64

    def left() -> float:
        return a.deadline - time.time() - 10

    plan = json.loads(plan_file.read_text()) if plan_file.exists() else {}
    flags, why = choose_flags(a, results, batch, left())
    if "flags" in plan and a.paper_flags is None:  # a run being resumed keeps its setting
        flags, why = plan["flags"], plan["flags_why"]
    fig = {"flags": flags, "flags_why": why, "paper": PAPER}

    def save(failed: bool = False) -> int:
        write_json(part, fig | {"plan": plan})
        write_json(plan_file, plan)
        return int(failed)

    data = ["--dataset", "imagefolder", "--data-root", a.data, "--batch-size", batch, "--seed", "0"]
    arch = ["--arch", "vgg", *(["--cfg", TINY_CFG] if a.smoke else ["--depth", "19"])]
    if not pruned.exists() and a.state and (a.state / "pruned.pth").exists():
        shutil.copy(a.state / "pruned.pth", pruned)
        fig["resumed_from"] = f"{a.state / 'pruned.pth'}: sparsity training and pruning not redone"
    if pruned.exists():  # a warm rerun or --state: those stages' figures as they were
        fig |= {k: old[k] for k in ("sparse", "prune") if k in old}
        plan = plan or old.get("plan", {})
    else:
        train = ["train", *arch, *data, *flags, "--sparsity", "1e-4", "--save", sparse, "--resume", "auto"]
        if not plan:  # the probe: the first epochs of a 160-epoch run, timed as each ends, then stopped
            probe, start, ends = (2 if a.max_epochs >= 4 else 1), time.time(), []

            def stop() -> bool:  # a metrics line follows its epoch's checkpoints: stopping is safe
                while len(ends) < len(metrics(sparse)):
                    ends.append(time.time() - start)
                return len(ends) >= probe

            r = slimming(*train, "--epochs", a.max_epochs, timeout=left(), log=a.log, stop=stop)
            rows = metrics(sparse)
            if len(rows) < probe or len(ends) < probe:
                fig["sparse"] = {**r, "status": "failed in the probe epochs"}
                return save(failed=True)
            e = max(ends[-1] - ends[-2] if probe > 1 else rows[0]["seconds"], 0.01)  # train, test, save
            c = max(0.0, rows[0]["seconds"] - rows[-1]["seconds"]) if probe > 1 else 0.0
            o = max(0.0, ends[0] - e - c)  # start, data, model
            n = max(probe, min(a.max_epochs, int((left() - 4 * o - 10 - 2 * c + probe * e) // (2 * e))))
            plan = {"probe_epochs": probe, "epoch_s": round(e, 3), "compile_s": round(c, 2),
                    "process_s": round(o, 2), "probe_wall_s": r["seconds"], "time_left_s": round(left()),
                    "epochs": n, "lr_schedule_exact": n >= 3 * probe or n == a.max_epochs,
                    "flags": flags, "flags_why": why}
            save()
        n, o, c, e = plan["epochs"], plan["process_s"], plan["compile_s"], plan["epoch_s"]
        reserve = (2 * o + 10) + (o + c + max(1, n // 2) * e)  # prune, stats, eval; half a fine-tune
        r = slimming(*train, "--epochs", n, timeout=left() - reserve, log=a.log)
        fig["sparse"] = {**r, "epochs_planned": n, **accuracy(metrics(sparse)),
                         "wall_s": round(r["seconds"] + plan.get("probe_wall_s", 0), 1)}
        save()
        if not (sparse / "best.pth").exists():
            return save(failed=True)
        fig["prune"] = slimming("prune", "--checkpoint", sparse / "best.pth", "--percent", "0.7", "--save",
                                pruned.parent, "--overwrite", timeout=left(), log=a.log)
        if fig["prune"]["rc"] != 0:
            return save(failed=True)
        cap = work / "stats.out"
        slimming("stats", "--checkpoint", sparse / "best.pth", "--compare", pruned, "--json", "--repeats",
                 1 if a.smoke else 20, timeout=left(), log=a.log, capture=cap)
        text = cap.read_text()
        if "{" in text:  # after the CPU notice, if any
            stats = list(json.JSONDecoder().raw_decode(text[text.index("{"):])[0].values())
            fig["prune"] |= {f"{k}_{w}": s[k] for w, s in zip(("before", "after"), stats)
                             for k in ("params", "flops", "latency_ms")}
        cap = work / "eval.out"
        slimming("eval", "--checkpoint", pruned, *data[:-2], timeout=left(), log=a.log, capture=cap)
        found = re.search(r"top-1 accuracy ([\d.]+)%", cap.read_text())
        fig["prune"]["acc_right_after"] = float(found.group(1)) if found else None
        save()
    if pruned.stat().st_size <= RETURN_LIMIT:
        shutil.copy(pruned, a.out / "pruned.pth")
    o, c, e = plan.get("process_s", 30), plan.get("compile_s", 0), plan.get("epoch_s", 30)
    if not ((ft / "last.pth").exists() and plan.get("finetune_epochs")):  # else resume its schedule
        plan["finetune_epochs"] = max(1, min(plan.get("epochs", a.max_epochs), int((left() - o - c) // e)))
    m = plan["finetune_epochs"]
    save()
    r = slimming("finetune", "--checkpoint", pruned, *data, *flags, "--epochs", m, "--save", ft, "--resume",
                 "auto", timeout=left(), log=a.log)
    fig["finetune"] = f = {**r, "epochs_planned": m, **accuracy(metrics(ft))}
    if (ft / "best.pth").exists():  # its weights alone (best.pth holds the momentum too: 2x)
        import slimming as sl

        ckpt = sl.load_checkpoint(ft / "best.pth")
        keep = {k: ckpt.get(k) for k in ("epoch", "acc", "best_acc", "cfg_mask", "data")}
        sl.save_checkpoint(sl.checkpoint_dict(sl.load_model(ft / "best.pth"), **keep), work / "finetuned.pth")
        if (work / "finetuned.pth").stat().st_size <= RETURN_LIMIT:
            shutil.copy(work / "finetuned.pth", a.out / "finetuned.pth")
    s, p = fig.get("sparse", {}), fig.get("prune", {})
    fig["schedule"] = (f"{s.get('epochs_done')} of {s.get('epochs_planned')} sparsity epochs + "
                       f"{f['epochs_done']} of {m} fine-tune epochs, batch {batch}, "
                       f"{' '.join(flags) or 'fp32'}; the paper: 160 + 160")
    after = p.get("acc_right_after")
    fig["summary"] = {"error_sparse": s.get("error"), "error_finetuned": f["error"],
                      "error_pruned": None if after is None else round(100 - after, 2),
                      "params": [p.get("params_before"), p.get("params_after")],
                      "flops": [p.get("flops_before"), p.get("flops_after")],
                      "paper": "6.34% -> 6.20% error, 20.04M -> 2.30M parameters, 7.97e8 -> 3.91e8 FLOPs; "
                               "its 'before' is a baseline trained without sparsity"}
    return save(failed=r["rc"] != 0 and not r["timed_out"])


# --------------------------------------------------------------------------- the driver

def tiny_data(work: Path) -> tuple[Path, str]:
    """A tiny 32x32 JPEG ImageFolder (10 classes, 64 + 2 images each), packed if it can be."""
    import random

    from PIL import Image

    root, rng = work / "tiny", random.Random(0)
    for split, count in (("train", 64), ("test", 2)):
        for c in range(10):
            (root / split / f"c{c}").mkdir(parents=True, exist_ok=True)
            for i in range(count):
                colour = tuple(25 * c + rng.randrange(20) for _ in range(3))
                Image.new("RGB", (32, 32), colour).save(root / split / f"c{c}" / f"{i}.jpg", quality=90)
    try:
        from slimming.data.packed import pack_folder
    except ImportError:
        return root, "folder (slimming.data.packed not available: the folder itself is the data)"
    pack_folder(root, work / "tiny.pack")
    return work / "tiny.pack", "pack"


def environment() -> dict:
    import platform

    import torch

    env = {"python": platform.python_version(), "torch": torch.__version__,
           "cuda_available": torch.cuda.is_available(), "cpus": os.cpu_count()}
    for key, cmd in (("gpu", ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.sm",
                              "--format=csv,noheader"]),
                     ("commit", ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"])):
        try:
            env[key] = subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip() or None
        except (OSError, subprocess.TimeoutExpired):
            env[key] = None
    return env


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line and exit 2, as slimming's commands (which may not
        self.exit(2, f"{self.prog}: error: {message}\n")  # be installed yet when this runs)


def out_folder(text: str) -> Path:
    path = Path(text)
    if any(p.exists() and not p.is_dir() for p in [path, *path.parents]):
        raise argparse.ArgumentTypeError(f"{text} is a file (or inside one), not a folder")
    return path


def parse(argv=None) -> argparse.Namespace:
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=out_folder, required=True,
                   help="results.json, run.log, pruned.pth, finetuned.pth")
    p.add_argument("--data", type=Path, default=REPO / "gpu-data/cifar10.pack", help="the packed CIFAR-10")
    p.add_argument("--steps", default=",".join(STEPS), help="comma list of: " + ", ".join(STEPS))
    p.add_argument("--budget-s", type=float, default=None, help="seconds for everything (540; smoke 150)")
    p.add_argument("--shares", default="correctness=0.25,throughput=0.3,paper=0.45",
                   help="each step's share of the time left when it starts")
    p.add_argument("--smoke", action="store_true", help="every step, tiny, on whatever device is here")
    p.add_argument("--no-install", action="store_true", help="skip pip install --no-deps -e .")
    p.add_argument("--work", type=out_folder, default=None, help="full runs (runs/gpu-work; smoke: OUT/work)")
    p.add_argument("--state", type=Path, default=None, help="a previous OUT copied back: resume from it")
    p.add_argument("--paper-flags", default=None, help="training flags for the paper step, e.g. "
                   "'--paper-flags=--amp --amp-dtype bfloat16' (default: step 2's best)")
    p.add_argument("--max-epochs", type=int, default=None, help="each stage's epochs at most (160; smoke 2)")
    p.add_argument("--workers", type=int, default=None, help="torchvision loader workers (12; smoke 0)")
    for hidden in ("--child", "--deadline", "--part", "--results"):
        p.add_argument(hidden, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.budget_s = a.budget_s or (150.0 if a.smoke else 540.0)
    a.work = (a.work or (a.out / "work" if a.smoke else REPO / "runs/gpu-work")).resolve()
    a.state = a.state and a.state.resolve()
    a.max_epochs = a.max_epochs or (2 if a.smoke else 160)
    a.workers = (0 if a.smoke else 12) if a.workers is None else a.workers
    a.out, a.data, a.log = a.out.resolve(), a.data.resolve(), a.out.resolve() / "run.log"
    a.deadline = a.deadline and float(a.deadline)
    a.part, a.results = (Path(v) if v else None for v in (a.part, a.results))
    return a


def main(argv=None) -> int:
    a = parse(argv)
    if a.child:
        return {"throughput": throughput, "paper": paper}[a.child](a, a.part) or 0
    start = time.time()

    def forward(sig, _frame):  # stopped: the running step goes too
        for pgid in RUNNING:
            try:
                os.killpg(pgid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        sys.exit(128 + sig)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    steps = [s for s in STEPS if s in a.steps.split(",")]
    shares = {k: float(v) for k, v in (kv.split("=") for kv in a.shares.split(","))}
    if set(a.steps.split(",")) - set(STEPS) or set(steps) - set(shares):
        sys.exit(f"--steps: choose from {', '.join(STEPS)}, each with a share in --shares")
    for d in (a.out, a.work):
        d.mkdir(parents=True, exist_ok=True)
    os.environ |= {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
                   "PYTHONUNBUFFERED": "1"}
    if a.smoke:  # its own caches; one thread: tiny convolutions on shared cores wait less
        os.environ |= {"XDG_CACHE_HOME": str(a.work / "cache"), "OMP_NUM_THREADS": "1"}
    path = a.out / "results.json"
    results = {"script": "benchmarks/gpu/run.py", "smoke": a.smoke, "argv": sys.argv[1:], "steps": {},
               "budget_s": a.budget_s, "shares": shares,
               "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start))}
    previous = a.state / "results.json" if a.state else a.work / "results.json"
    if previous.exists():
        for k, v in json.loads(previous.read_text()).get("steps", {}).items():
            results["steps"][k] = {**v, "from_previous_run": str(previous)}

    def save() -> None:
        results["elapsed_s"] = round(time.time() - start, 1)
        write_json(path, results)
        write_json(a.work / "results.json", results)

    def say(text: str) -> None:
        print(text, flush=True)
        with open(a.log, "a") as f:
            f.write(f"[run.py {time.time() - start:6.1f} s] {text}\n")

    results["environment"] = environment()
    if not a.no_install:  # offline: no index, no build isolation (it would fetch setuptools)
        results["install"] = run_cmd([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                                      "--no-build-isolation", "--disable-pip-version-check", "-e", REPO],
                                     180, a.log)
    a.data, kind = tiny_data(a.work) if a.smoke else (a.data, "pack" if a.data.is_file() else "missing")
    results["data"] = {"path": str(a.data), "kind": kind,
                       "bytes": a.data.stat().st_size if a.data.is_file() else None}
    save()
    for i, step in enumerate(steps):
        budget = (a.budget_s - (time.time() - start) - 5) * shares[step] / sum(shares[s] for s in steps[i:])
        if step != "correctness" and not (a.smoke or results["environment"]["cuda_available"]):
            r = {"status": "skipped", "why": "no CUDA device here (--smoke runs every step on a CPU)"}
        elif step != "correctness" and not a.data.exists():
            r = {"status": "skipped", "why": f"no data at {a.data}"}
        elif budget < 10:
            r = {"status": "skipped", "why": f"{budget:.0f} s of the budget left"}
        elif step == "correctness":
            say(f"{step}: up to {budget:.0f} s")
            r = correctness(a, budget)
        else:
            say(f"{step}: up to {budget:.0f} s")
            part = a.work / f"{step}.json"
            part.unlink(missing_ok=True)
            cmd = [sys.executable, __file__, "--child", step, "--out", a.out, "--data", a.data,
                   "--work", a.work, "--deadline", time.time() + budget, "--part", part, "--results", path,
                   "--max-epochs", a.max_epochs, "--workers", a.workers, *(["--smoke"] if a.smoke else []),
                   *(["--state", a.state] if a.state else []),
                   *([f"--paper-flags={a.paper_flags}"] if a.paper_flags is not None else [])]
            seen = [0.0]

            def merge(step=step, part=part, budget=budget, seen=seen) -> bool:  # figures as they come
                if part.exists() and part.stat().st_mtime > seen[0]:
                    seen[0] = part.stat().st_mtime
                    results["steps"][step] = {"status": "running", "budget_s": round(budget, 1),
                                              "figures": json.loads(part.read_text())}
                    save()
                return False

            r = run_cmd(cmd, budget, a.log, stop=merge)
            r["status"] = "timeout" if r["timed_out"] else "ok" if r["rc"] == 0 else "error"
            r["figures"] = json.loads(part.read_text()) if part.exists() else {}
            if r["status"] == "ok" and (r["figures"].get("errors") or r["figures"].get("not_run")):
                r["status"] = "partial"  # see figures: errors, not_run
        if r["status"] not in ("ok", "skipped", "partial"):
            r["log_tail"] = a.log.read_text(errors="replace").splitlines()[-15:]
        results["steps"][step] = r | {"budget_s": round(budget, 1)}
        save()
        say(f"{step}: {r['status']}" + (f" in {r['seconds']:.0f} s" if "seconds" in r else f" ({r['why']})"))
    say(f"done in {time.time() - start:.0f} s: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
