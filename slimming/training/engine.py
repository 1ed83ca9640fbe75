"""The one train/evaluate loop, shared by ``slimming train`` and ``slimming finetune``.

One optimisation step, in order: forward under autocast (``--amp``), ``backward()`` on the
scaled loss, ``scaler.unscale_``, gradient clipping (``--grad-clip``), the L1 subgradient on the
gammas (on unscaled, clipped gradients, so neither the loss scale nor clipping changes the
sparsity strength), ``scaler.step`` (skips the step on inf/nan gradients), ``scaler.update``.
"""

from __future__ import annotations

import math
import random
import sys
import time
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import SlimmingError, TrainingError  # noqa: F401 (TrainingError: re-exported)
from ..utils import progress
from .distributed import DistInfo, all_reduce_sum
from .saver import CheckpointSaver
from .sparsity import SPARSE_BOUND, Sparsity, SparsityController

PROGRESS_S = 10.0  # seconds between progress lines when the output is a log, not a terminal

AMP_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def lr_milestones(epochs: int) -> list[int]:
    """Epochs at which the step schedule multiplies the learning rate by 0.1: 50% and 75% of
    ``epochs``, in integer arithmetic so that no milestone is skipped whatever the count."""
    return sorted({m for m in (epochs // 2, epochs * 3 // 4) if m > 0})


def lr_factor(epoch: int, epochs: int, sched: str = "step", warmup_epochs: int = 0) -> float:
    """The learning rate of ``epoch`` (0-based) as a fraction of the base rate."""
    if epoch < warmup_epochs:
        return (epoch + 1) / (warmup_epochs + 1)
    if sched == "cosine":
        span = max(epochs - warmup_epochs, 1)
        return 0.5 * (1 + math.cos(math.pi * (epoch - warmup_epochs) / span))
    return 0.1 ** sum(epoch >= m for m in lr_milestones(epochs))


def make_scheduler(optimizer: torch.optim.Optimizer, epochs: int, sched: str = "step",
                   warmup_epochs: int = 0) -> torch.optim.lr_scheduler.LambdaLR:
    """Per-epoch schedule: ``step`` (x0.1 at 50% and 75%) or ``cosine``, after a linear warm-up."""
    if sched not in ("step", "cosine"):
        raise SlimmingError(f"unknown schedule {sched!r}; choose step or cosine")
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda e: lr_factor(e, epochs, sched, warmup_epochs))


def make_optimizer(model: nn.Module, opt: str = "sgd", lr: float = 0.1, momentum: float = 0.9,
                   weight_decay: float = 1e-4, nesterov: bool = False,
                   no_wd_bn: bool = False) -> torch.optim.Optimizer:
    """SGD with momentum (the paper's) or AdamW. ``no_wd_bn`` exempts BN weights and biases
    from weight decay, which otherwise pulls on the gammas the L1 term is shaping."""
    bn_params = {id(p) for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
                 for p in m.parameters(recurse=False)}
    params = list(model.parameters())
    if no_wd_bn:
        groups = [{"params": [p for p in params if id(p) not in bn_params]},
                  {"params": [p for p in params if id(p) in bn_params], "weight_decay": 0.0}]
    else:
        groups = [{"params": params}]
    if opt == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=momentum, weight_decay=weight_decay,
                               nesterov=nesterov and momentum > 0)
    if opt == "adamw":
        return torch.optim.AdamW(groups, lr=lr, weight_decay=weight_decay)
    raise SlimmingError(f"unknown optimizer {opt!r}; choose sgd or adamw")


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@torch.inference_mode()
def evaluate(model: nn.Module, loader: Iterable, device: torch.device,
             channels_last: bool = False, show_progress: bool = True,
             dist: DistInfo | None = None) -> dict[str, float]:
    """Mean cross-entropy, top-1 accuracy (%) and image count of ``model`` over ``loader``;
    with ``dist`` (a DDP run whose ranks each hold a shard), summed over all ranks."""
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=device)  # loss, correct, count
    for x, y in progress.bar(loader, desc="test", unit="batch", show=show_progress):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        out = model(x).float()
        sums[0] += nn.functional.cross_entropy(out, y, reduction="sum")
        sums[1] += (out.argmax(1) == y).sum()
        sums[2] += len(y)
    if dist is not None and dist.enabled:
        all_reduce_sum(sums)
    loss, correct, count = sums.tolist()
    return {"loss": loss / max(count, 1), "acc": 100.0 * correct / max(count, 1), "count": int(count)}


class Trainer:
    """Owns the model, optimizer, schedule, AMP scaler and sparsity term of one run.

    ``loss_fn(logits, targets)``: the training loss (default: cross-entropy with
    ``label_smoothing``), computed in float32 on the float32 logits."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler,
                 device: torch.device, *, sparsity: Sparsity | None = None,
                 amp_dtype: torch.dtype | None = None, grad_clip: float = 0.0,
                 label_smoothing: float = 0.0, channels_last: bool = False,
                 dist: DistInfo | None = None, controller: SparsityController | None = None,
                 loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None):
        self.model, self.optimizer, self.scheduler, self.device = model, optimizer, scheduler, device
        self.sparsity, self.amp_dtype, self.grad_clip = sparsity, amp_dtype, grad_clip
        self.channels_last, self.dist = channels_last, dist or DistInfo()
        self.controller = controller  # --sparsity-target: steers self.sparsity.strength
        self.criterion = loss_fn or nn.CrossEntropyLoss(label_smoothing=label_smoothing)
        # float16 needs loss scaling; bfloat16 has float32's range and does not
        self.scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)
        self._applied = torch.ones((), dtype=torch.bool, device=device)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One optimisation step; returns (loss, logits, a 0-d bool tensor: step applied)."""
        with torch.autocast(self.device.type, dtype=self.amp_dtype or torch.float32,
                            enabled=self.amp_dtype is not None):
            out = self.model(x)
            loss = self.criterion(out.float(), y)
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.optimizer)
        if self.grad_clip > 0:
            nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        if self.sparsity is not None:
            # After unscale_: S does not depend on the loss scale. On an inf/nan step the
            # scaler skips optimizer.step(), so the subgradient is never applied either.
            self.sparsity.apply()
        if not self.scaler.is_enabled():
            self.optimizer.step()
            return loss.detach(), out.detach(), self._applied
        # The scaler halves its scale when it skips a step. Compare on the device (its _scale
        # tensor) rather than with get_scale(), which would wait for the GPU at every step.
        before = self.scaler._scale.detach().clone()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return loss.detach(), out.detach(), self.scaler._scale >= before

    def train_one_epoch(self, loader: Iterable, desc: str = "train") -> dict[str, float]:
        """One pass over ``loader``: mean loss, top-1 accuracy (%) and skipped AMP steps."""
        self.model.train()
        sums = torch.zeros(3, dtype=torch.float64, device=self.device)  # loss, correct, count
        skipped = torch.zeros((), dtype=torch.long, device=self.device)
        bar = progress.bar(loader, desc=desc, unit="batch", show=self.dist.is_main)
        steer = self.controller if self.sparsity is not None else None
        # in a log (stdout not a terminal) tqdm is silent: a plain line every PROGRESS_S instead
        plain = bar.disable and self.dist.is_main and not progress.is_quiet() and not sys.stdout.isatty()
        start = last = time.monotonic()
        total = len(loader) if hasattr(loader, "__len__") else None
        for i, (x, y) in enumerate(bar):
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            if self.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            loss, out, applied = self.step(x, y)
            if steer is not None and steer.due(i + 1):
                self.sparsity.strength = steer.update(self.sparsity, i + 1)
            skipped += ~applied
            sums[0] += loss * len(y)
            sums[1] += (out.argmax(1) == y).sum()
            sums[2] += len(y)
            if i % 20 == 0 and not bar.disable:
                bar.set_postfix(loss=f"{sums[0].item() / sums[2].item():.3f}")
            if plain and time.monotonic() - last >= PROGRESS_S:
                last = time.monotonic()
                print(f"  {desc}: batch {i + 1}{f'/{total}' if total else ''}  loss "
                      f"{sums[0].item() / sums[2].item():.4f}  {last - start:.0f}s", flush=True)
        loss, correct, count = all_reduce_sum(sums).tolist()
        if not math.isfinite(loss):
            raise TrainingError("the training loss became non-finite (nan/inf): lower lr or "
                                "sparsity; the last good checkpoint is kept", param=("lr", "sparsity"))
        return {"loss": loss / max(count, 1), "acc": 100.0 * correct / max(count, 1),
                "skipped": int(skipped)}

    def state_dict(self) -> dict[str, Any]:
        """Everything besides the weights that a resumed run needs."""
        state = {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                 "scaler": self.scaler.state_dict(), "rng": rng_state()}
        if self.sparsity is not None:  # the controller's current strength, for --resume
            state["sparsity_strength"] = float(self.sparsity.strength)
        if self.controller is not None:
            state["sparsity_peak_lr"] = float(self.controller.peak_lr)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        if state.get("rng"):
            set_rng_state(state["rng"])
        if self.controller is not None and self.sparsity is not None and state.get("sparsity_strength"):
            self.sparsity.strength = float(state["sparsity_strength"])
            self.controller.peak_lr = float(state.get("sparsity_peak_lr") or 0.0)

    def fit(self, train_loader, test_loader, *, epochs: int, saver: CheckpointSaver | None = None,
            save_dir: str | Path | None = None, start_epoch: int = 0, best_acc: float = 0.0,
            extra: dict[str, Any] | None = None, log: Callable[[str], None] = print) -> dict:
        """Train epochs ``start_epoch`` .. ``epochs - 1``, evaluating after each one.

        After each epoch rank 0 hands ``saver`` (``CheckpointSaver(save_dir, extra)`` when only
        ``save_dir`` is given; nothing is written without either) the epoch's metrics: epoch, lr,
        train_loss, train_acc, test_loss, test_acc, gamma_lt_1e-2 (the fraction of prunable
        |gamma| under the sparsity bound), sparsity (the L1 strength the epoch started with),
        amp_skipped, seconds; with a controller, which steers the strength within the epoch, also
        sparsity_end (the strength the epoch ended with). Returns the last epoch's metrics and
        best_acc.
        """
        if saver is None and save_dir is not None:
            saver = CheckpointSaver(save_dir, extra)
        bound = self.controller.bound if self.controller is not None else SPARSE_BOUND
        probe = self.sparsity or Sparsity(self.model, 0.0)  # reports the |gamma| fraction
        row: dict[str, Any] = {}
        watch = DivergenceWatch()
        for epoch in range(start_epoch, epochs):
            start = time.perf_counter()
            if hasattr(train_loader, "set_epoch"):
                train_loader.set_epoch(epoch)
            lr = self.optimizer.param_groups[0]["lr"]
            strength = self.sparsity.strength if self.sparsity else 0.0
            if self.controller is not None and self.sparsity is not None:
                self.controller.start_epoch(self.sparsity, epoch, epochs, len(train_loader), lr)
            train = self.train_one_epoch(train_loader, desc=f"epoch {epoch + 1}/{epochs}")
            self.scheduler.step()
            test = evaluate(self.model, test_loader, self.device, self.channels_last,
                            self.dist.is_main, self.dist)
            row = {"epoch": epoch + 1, "lr": lr, "train_loss": train["loss"],
                   "train_acc": train["acc"], "test_loss": test["loss"], "test_acc": test["acc"],
                   "gamma_lt_1e-2": probe.fraction_below(bound),
                   "sparsity": strength, "amp_skipped": train["skipped"],
                   "seconds": round(time.perf_counter() - start, 3)}
            if self.controller is not None and self.sparsity is not None:
                row["sparsity_end"] = self.sparsity.strength  # where the controller left it
            is_best = test["acc"] > best_acc
            best_acc = max(best_acc, test["acc"])
            if self.dist.is_main:
                if saver is not None:
                    saver.save(self.model, row, self.state_dict(), best_acc=best_acc, is_best=is_best)
                skipped = f"  amp skipped {train['skipped']}" if self.scaler.is_enabled() else ""
                log(f"epoch {epoch + 1}/{epochs}  lr {lr:.4g}  train loss {train['loss']:.4f}  "
                    f"test loss {test['loss']:.4f}  test acc {test['acc']:.2f}%  "
                    f"|gamma|<{_short(bound)} {100 * row['gamma_lt_1e-2']:.1f}%{skipped}  "
                    f"{row['seconds']:.1f}s")
                for message in watch.see(row):
                    warnings.warn(message, stacklevel=2)
        return {**row, "best_acc": best_acc}


class DivergenceWatch:
    """Says, once each, when a run diverges: a loss that is not finite, a training loss that
    rose to ``RISE`` times its lowest epoch, a test loss to ``TEST_RISE`` times its lowest (a
    run at too high a learning rate went from a training loss of 2.9 to 6.0 and a test loss of
    11437 without a word)."""

    RISE, TEST_RISE = 1.5, 10.0

    def __init__(self):
        self.low: dict[str, float] = {}
        self.said: set[str] = set()

    def see(self, row: dict) -> list[str]:
        out = []
        for key, rise in (("train_loss", self.RISE), ("test_loss", self.TEST_RISE)):
            value, low = row[key], self.low.get(key)
            what = key.replace("_", " ")
            if not math.isfinite(value):
                out.append(self._once(f"{key}:finite", f"the {what} is {value} at epoch {row['epoch']}: "
                                      "the run diverged; lower --lr (lr=) or --sparsity, or keep --amp off"))
            elif low is not None and value > rise * low and value - low > 0.1:
                out.append(self._once(key, f"the {what} rose to {value:.4g} at epoch {row['epoch']} from "
                                      f"{low:.4g}: the run may be diverging; a lower --lr (lr=) or "
                                      "--sparsity usually steadies it"))
            if math.isfinite(value):
                self.low[key] = value if low is None else min(low, value)
        return [m for m in out if m]

    def _once(self, key: str, message: str) -> str:
        if key in self.said:
            return ""
        self.said.add(key)
        return message


def _short(x: float) -> str:
    """1e-2 as the README and the flags write it, not 0.01 (0.015 stays 0.015)."""
    mantissa, exponent = f"{x:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}" if float(f"{mantissa}e{exponent}") == x else f"{x:g}"
