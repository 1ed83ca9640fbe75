"""Hugging Face ``Trainer``: ``SparsityCallback`` applies the L1 subgradient to the scaling
factors at every optimizer step (``on_pre_optimizer_step``: once the gradients of
``gradient_accumulation_steps`` batches are summed and clipped, before ``optimizer.step()``).

    from slimming.integrations.huggingface import SparsityCallback
    trainer = Trainer(model, args, train_dataset=..., callbacks=[SparsityCallback(1e-4)])

A transformer's LayerNorms score no width alone: ``slimming.add_gates(model, example)`` first
puts a gate per head and before each MLP's second layer, which the callback makes sparse.
"""

from __future__ import annotations

try:
    from transformers import TrainerCallback
except ImportError as e:  # an optional integration: one line, not a chain of tracebacks
    raise ImportError("slimming.integrations.huggingface needs transformers: pip install transformers") \
        from e

from ..errors import SlimmingError, number
from ..training.sparsity import Sparsity


class SparsityCallback(TrainerCallback):
    """``Sparsity(model, strength, ignore)`` at every optimizer step of a Hugging Face
    ``Trainer``, the model the trainer trains. ``sparsity`` (a ``Sparsity``) is set when training
    begins; ``sparsity.fraction_below()`` says how far it has got."""

    def __init__(self, strength: float, ignore=()):
        self.strength, self.ignore = number(strength, "strength", low=0), ignore
        self.sparsity: Sparsity | None = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if getattr(args, "fp16", False) and not args.max_grad_norm > 0:
            raise SlimmingError("SparsityCallback with fp16 needs max_grad_norm > 0: without clipping the "
                                "Trainer unscales the gradients only inside optimizer.step(), after the L1 "
                                "step", param="max_grad_norm")
        self.sparsity = Sparsity(model, self.strength, self.ignore)
        if not self.sparsity.params:
            raise SlimmingError("SparsityCallback: the model has no scaling factor to make sparse (no "
                                "BatchNorm, GroupNorm or gate); slimming.add_gates(model, example) adds them",
                                param="model")

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.sparsity.apply()
