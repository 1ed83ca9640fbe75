"""Training: the one train/eval loop (``engine``), the L1 penalty on BatchNorm gammas and its
controller (``sparsity``), torchrun (``distributed``), what a run writes (``saver``), and a whole
run, ``train`` and ``finetune`` alike: ``train(TrainConfig(...), model)`` (``config``, ``train``;
``runs``: the device, the data and the outputs a run and the commands share).

Which parts it may import: ``docs/layout.md``.
"""

from .config import TrainConfig
from .engine import Trainer
from .saver import CheckpointSaver
from .train import TrainResult, train

__all__ = ["CheckpointSaver", "TrainConfig", "TrainResult", "Trainer", "train"]
