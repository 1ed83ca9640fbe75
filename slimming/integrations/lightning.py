"""Lightning: ``SparsityCallback`` applies the L1 subgradient to the scaling factors at every
optimizer step (``on_before_optimizer_step``: once ``accumulate_grad_batches`` batches are summed
and, under mixed precision, unscaled; before clipping and ``optimizer.step()``).

    from slimming.integrations.lightning import SparsityCallback
    trainer = lightning.Trainer(callbacks=[SparsityCallback(1e-4)])

``lightning`` (``lightning.pytorch``) is used where installed, else ``pytorch_lightning``.
"""

from __future__ import annotations

try:
    from lightning.pytorch import Callback
except ImportError:
    try:
        from pytorch_lightning import Callback
    except ImportError as e:  # an optional integration: one line, not a chain of tracebacks
        raise ImportError("slimming.integrations.lightning needs Lightning: pip install lightning") from e

from ..errors import SlimmingError, number
from ..training.sparsity import Sparsity


class SparsityCallback(Callback):
    """``Sparsity(pl_module, strength, ignore)`` at every optimizer step of a Lightning
    ``Trainer``; ``ignore`` names modules as the ``LightningModule`` holds them
    (``"model.head"``). ``sparsity`` (a ``Sparsity``) is set when fitting begins."""

    def __init__(self, strength: float, ignore=()):
        self.strength, self.ignore = number(strength, "strength", low=0), ignore
        self.sparsity: Sparsity | None = None

    def on_fit_start(self, trainer, pl_module):
        self.sparsity = Sparsity(pl_module, self.strength, self.ignore)
        if not self.sparsity.params:
            raise SlimmingError("SparsityCallback: the module has no scaling factor to make sparse (no "
                                "BatchNorm, GroupNorm or gate); slimming.add_gates(model, example) adds them",
                                param="pl_module")

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.sparsity.apply()
