"""Sparsity training inside the trainers users already train with: each applies
``slimming.Sparsity`` (the L1 subgradient on the scaling factors) at the one point of the
trainer's step where it is right, after the gradients are accumulated and unscaled, before
the optimizer steps.

- ``huggingface``: ``SparsityCallback``: a ``transformers.TrainerCallback``
  (``on_pre_optimizer_step``).
- ``lightning``: ``SparsityCallback``: a Lightning ``Callback``
  (``on_before_optimizer_step``).
- ``ultralytics``: ``sparse_trainer``: a subclass of an Ultralytics trainer,
  which fires no callback there (slimming never imports Ultralytics: you pass its class).

Each module imports its library only when imported itself (``from slimming.integrations.lightning
import SparsityCallback``); none is a dependency of slimming. What this part may import:
docs/layout.md.
"""
