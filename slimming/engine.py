"""The one train/evaluate loop, shared by ``slimming train`` and ``slimming finetune``."""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from .checkpoint import checkpoint_dict, save_checkpoint
from .sparsity import BNSparsity

NO_CUDA_NOTICE = "slimming: no CUDA device found, running on the CPU"


class TrainingError(RuntimeError):
    """The run cannot go on (for example a non-finite loss); one line meant for the user."""


def resolve_device(device: str | None = None, cpu: bool = False,
                   quiet: bool = False) -> torch.device:
    """CUDA when present, else the CPU with a one-line notice (unless ``quiet``). ``cpu=True``
    forces the CPU; asking for ``cuda`` where there is none is a ValueError."""
    if cpu or device == "cpu":
        return torch.device("cpu")
    if device is not None:
        dev = torch.device(device)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"--device {device}: no CUDA device is available here; use --cpu")
        return dev
    if torch.cuda.is_available():
        return torch.device("cuda")
    if not quiet:
        print(NO_CUDA_NOTICE, file=sys.stderr)
    return torch.device("cpu")


def lr_milestones(epochs: int) -> list[int]:
    """Epochs at which the learning rate is multiplied by 0.1: 50% and 75% of ``epochs``,
    in integer arithmetic so that no milestone is skipped whatever the epoch count."""
    return sorted({m for m in (epochs // 2, epochs * 3 // 4) if m > 0})


def make_optimizer(model: nn.Module, lr: float = 0.1, momentum: float = 0.9,
                   weight_decay: float = 1e-4, nesterov: bool = False) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum,
                           weight_decay=weight_decay, nesterov=nesterov and momentum > 0)


def make_scheduler(optimizer: torch.optim.Optimizer, epochs: int):
    return torch.optim.lr_scheduler.MultiStepLR(optimizer, lr_milestones(epochs), gamma=0.1)


def train_one_epoch(model: nn.Module, loader: Iterable, optimizer: torch.optim.Optimizer,
                    device: torch.device, sparsity: BNSparsity | None = None,
                    desc: str = "train") -> dict[str, float]:
    """One pass over ``loader``; returns mean loss and top-1 accuracy (%)."""
    model.train()
    criterion = nn.CrossEntropyLoss()
    total_loss = torch.zeros((), device=device)
    correct = torch.zeros((), dtype=torch.long, device=device)
    seen = 0
    bar = tqdm(loader, desc=desc, leave=False, dynamic_ncols=True, disable=None)
    for step, (x, y) in enumerate(bar):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        out = model(x)
        loss = criterion(out, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if sparsity is not None:
            sparsity.apply()  # L1 subgradient on the gammas, between backward() and step()
        optimizer.step()
        total_loss += loss.detach() * len(y)
        correct += (out.argmax(1) == y).sum()
        seen += len(y)
        if step % 20 == 0 and not bar.disable:
            bar.set_postfix(loss=f"{total_loss.item() / seen:.3f}")
    mean_loss = total_loss.item() / max(seen, 1)
    if not math.isfinite(mean_loss):
        raise TrainingError("the training loss became non-finite (nan/inf): lower --lr or "
                            "--sparsity; the last good checkpoint is kept")
    return {"loss": mean_loss, "acc": 100.0 * correct.item() / max(seen, 1)}


@torch.inference_mode()
def evaluate(model: nn.Module, loader: Iterable, device: torch.device) -> dict[str, float]:
    """Mean cross-entropy and top-1 accuracy (%) of ``model`` over ``loader``."""
    model.eval()
    total_loss = torch.zeros((), device=device)
    correct = torch.zeros((), dtype=torch.long, device=device)
    seen = 0
    for x, y in tqdm(loader, desc="test", leave=False, dynamic_ncols=True, disable=None):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        out = model(x)
        total_loss += nn.functional.cross_entropy(out, y, reduction="sum")
        correct += (out.argmax(1) == y).sum()
        seen += len(y)
    return {"loss": total_loss.item() / max(seen, 1), "acc": 100.0 * correct.item() / max(seen, 1)}


def fit(model: nn.Module, train_loader: Iterable, test_loader: Iterable, *, epochs: int,
        optimizer: torch.optim.Optimizer, scheduler, device: torch.device,
        save_dir: str | Path, sparsity: BNSparsity | None = None,
        extra: dict[str, Any] | None = None, log: Callable[[str], None] = print) -> dict:
    """Train for ``epochs``, evaluating after each one.

    Writes ``save_dir/last.pth`` every epoch, ``save_dir/best.pth`` on a new best test accuracy
    and one JSON line per epoch to ``save_dir/metrics.jsonl`` (epoch, lr, train_loss,
    train_acc, test_loss, test_acc, gamma_lt_1e-2, seconds). ``extra`` goes into every
    checkpoint (the run's args, cfg_mask, ...). Returns the last epoch's metrics and best_acc.
    """
    save_dir = Path(save_dir)
    save_dir.mkdir(parents=True, exist_ok=True)
    probe = sparsity or BNSparsity(model, 0.0)  # reports the |gamma| fraction in any case
    best_acc, row = 0.0, {}
    for epoch in range(epochs):
        start = time.perf_counter()
        lr = optimizer.param_groups[0]["lr"]
        train = train_one_epoch(model, train_loader, optimizer, device, sparsity,
                                desc=f"epoch {epoch + 1}/{epochs}")
        scheduler.step()
        test = evaluate(model, test_loader, device)
        row = {"epoch": epoch + 1, "lr": lr, "train_loss": train["loss"], "train_acc": train["acc"],
               "test_loss": test["loss"], "test_acc": test["acc"],
               "gamma_lt_1e-2": probe.fraction_below(1e-2),
               "seconds": round(time.perf_counter() - start, 3)}
        is_best = test["acc"] > best_acc
        best_acc = max(best_acc, test["acc"])
        ckpt = checkpoint_dict(model, epoch=epoch + 1, acc=test["acc"], best_acc=best_acc,
                               optimizer=optimizer.state_dict(), scheduler=scheduler.state_dict(),
                               **(extra or {}))
        save_checkpoint(ckpt, save_dir / "last.pth")
        if is_best:
            save_checkpoint(ckpt, save_dir / "best.pth")
        with open(save_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        log(f"epoch {epoch + 1}/{epochs}  lr {lr:.4g}  train loss {train['loss']:.4f}  "
            f"test loss {test['loss']:.4f}  test acc {test['acc']:.2f}%  "
            f"|gamma|<1e-2 {100 * row['gamma_lt_1e-2']:.1f}%  {row['seconds']:.1f}s")
    return {**row, "best_acc": best_acc}
