"""``TrainConfig``: everything a training run (``train`` and ``finetune`` alike) needs besides
the network, as one typed record. Its fields are the command line's flags, named as Python
names (``--weight-decay`` is ``weight_decay``) with the same defaults, so that ``slimming
train`` and a Python caller describe a run the same way."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# A fine-tune's learning rate, by its length, as a share of the training rate: the step schedule
# (x0.1 at 50% and 75% of the epochs) never decays in under 3 epochs, where a tenth of a tenth
# kept the cut's accuracy; 0.1 itself lost 14-28 points in one epoch (benchmarks/RESULTS.md,
# "A fine-tune's learning rate"). From 80 epochs, the paper's: its fine-tune is training's rate.
FINETUNE_SHARES = ((3, 0.01), (80, 0.1))  # (under this many epochs, this share of the rate)


def finetune_lr(epochs: int, lr: float = 0.1) -> float:
    """The default learning rate of a fine-tune of ``epochs`` epochs after training at ``lr``:
    ``lr / 100`` under 3 epochs, ``lr / 10`` under 80, ``lr`` from 80 on (the paper's 160)."""
    return lr * next((share for under, share in FINETUNE_SHARES if epochs < under), 1.0)


@dataclass
class TrainConfig:
    """A training run. ``save``: the folder for last.pth, best.pth and metrics.jsonl."""

    save: Path
    epochs: int = 160
    # data (slimming.data.build_loaders)
    dataset: str = "cifar10"
    data_root: Path | None = None
    download: bool = False
    batch_size: int = 64
    loader: str = "fast"
    workers: int = 2
    image_size: int | None = None
    norm: str | tuple | None = None  # "dataset", "imagenet" or ((mean,) * 3, (std,) * 3)
    limit: int | None = None  # an image folder's first N images of each class, in each split
    # optimisation (slimming.training.engine)
    opt: str = "sgd"
    lr: float = 0.1
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 1e-4
    no_wd_bn: bool = False
    sched: str = "step"
    warmup_epochs: int = 0
    label_smoothing: float = 0.0
    grad_clip: float = 0.0
    amp: bool = False
    amp_dtype: str | None = None  # float16 on CUDA, bfloat16 on the CPU when None
    channels_last: bool = False
    compile: bool = False
    sync_bn: bool = False
    seed: int | None = None
    deterministic: bool = False
    # sparsity (slimming.training.sparsity)
    sparsity: float = 0.0
    sparsity_target: float | None = None
    # the run
    resume: str | None = None  # a checkpoint path, or "auto": save/last.pth if it exists
    overwrite: bool = False
    cpu: bool = False
    device: str | None = None

    def __post_init__(self):
        self.save = Path(self.save)
        if self.data_root is not None:
            self.data_root = Path(self.data_root)

    @classmethod
    def from_args(cls, args: Any) -> TrainConfig:
        """The config of parsed command-line arguments (any object with these attributes)."""
        names = [f.name for f in dataclasses.fields(cls)]
        return cls(**{n: getattr(args, n) for n in names if hasattr(args, n)})
