"""slimming: network slimming (Liu et al., ICCV 2017) for PyTorch.

Train with an L1 penalty on BatchNorm gammas (``BNSparsity``), cut the channels under a global
|gamma| threshold (``prune``), fine-tune, and reload any checkpoint with ``load_model``. Every
mistake in the input raises ``SlimmingError`` (a ValueError) with a one-line message.
"""

from . import importance
from .checkpoint import checkpoint_dict, load_checkpoint, load_model, save_checkpoint
from .errors import CheckpointError, DataError, SlimmingError
from .prune import PruneResult, channel_masks, prunable_bns, prune
from .sparsity import BNSparsity, add_l1_subgradient
from .stats import count_flops, count_params, model_stats

__version__ = "0.1.0"

__all__ = ["BNSparsity", "importance", "CheckpointError", "DataError", "PruneResult", "SlimmingError",
           "add_l1_subgradient", "channel_masks", "checkpoint_dict", "count_flops", "count_params",
           "load_checkpoint", "load_model", "model_stats", "prunable_bns", "prune",
           "save_checkpoint"]
