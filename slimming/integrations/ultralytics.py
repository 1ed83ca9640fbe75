"""Ultralytics: ``sparse_trainer(DetectionTrainer, strength)`` is that trainer with the L1
subgradient applied at every optimizer step. Ultralytics' trainer fires no callback between the
backward pass and the step: its ``optimizer_step`` unscales the gradients, clips them, steps and
updates the EMA, once every ``accumulate`` batches. The subclass applies ``Sparsity`` right
after the unscaling (where clipping and the step see it), on the model being trained (the EMA
follows it). slimming never imports Ultralytics (AGPL): you pass its class.

    from ultralytics.models.yolo.detect import DetectionTrainer
    from ultralytics.nn.modules import Detect
    Trainer = sparse_trainer(DetectionTrainer, 1e-4, ignore=Detect)   # the head is kept whole
    Trainer(overrides=dict(model="yolo11n.yaml", data="coco8.yaml", epochs=100)).train()
"""

from __future__ import annotations

from torch import nn

from ..errors import SlimmingError, number
from ..training.sparsity import Sparsity

WRAPPERS = (nn.DataParallel, nn.parallel.DistributedDataParallel)


def sparse_trainer(trainer: type, strength: float, ignore=()) -> type:
    """A subclass of ``trainer`` (an Ultralytics trainer class: one with ``optimizer_step()``
    calling ``self.scaler.unscale_(self.optimizer)`` first, as Ultralytics 8 does) whose every
    optimizer step adds the L1 subgradient to the scaling factors of ``self.model`` (but those in
    ``ignore``: names or types, as ``slimming.prune`` takes them) once the gradients are unscaled.
    A step that never unscales raises SlimmingError: the L1 term would be applied to gradients
    still multiplied by the loss scale."""
    number(strength, "strength", low=0)
    if not isinstance(trainer, type) or not callable(getattr(trainer, "optimizer_step", None)):
        raise SlimmingError(f"sparse_trainer takes a trainer class with optimizer_step() (Ultralytics' "
                            f"DetectionTrainer), not {trainer!r}", param="trainer")

    class SparseTrainer(trainer):
        def optimizer_step(self):
            model = self.model.module if isinstance(self.model, WRAPPERS) else self.model  # under DDP
            if self.__dict__.get("sparse_model") is not model:  # the first step, or a model rebuilt
                self.sparse_model, self.sparsity = model, Sparsity(model, strength, ignore)
            sparsity, scaler, applied = self.sparsity, self.scaler, []

            def unscale_(optimizer):
                type(scaler).unscale_(scaler, optimizer)
                sparsity.apply()
                applied.append(True)

            scaler.unscale_ = unscale_
            try:
                super().optimizer_step()
            finally:
                del scaler.unscale_
            if not applied:
                raise SlimmingError(f"{trainer.__name__}.optimizer_step() never called self.scaler.unscale_: "
                                    "sparse_trainer applies the L1 step right after it", param="trainer")

    SparseTrainer.__name__ = SparseTrainer.__qualname__ = f"Sparse{trainer.__name__}"
    return SparseTrainer
