"""slimming: network slimming (Liu et al., ICCV 2017) for PyTorch.

Train with an L1 penalty on BatchNorm gammas (``BNSparsity``), cut the channels under a global
|gamma| threshold (``prune``), fine-tune, and reload any checkpoint with ``load_model``. Every
mistake in the input raises ``SlimmingError`` (a ValueError) with a one-line message.

The parts, as folders; each may import only those listed after it (``tests/test_layout.py``):
``cli`` -> ``tools`` -> ``training`` -> ``pruning``, ``io`` -> ``measure``, ``models`` ->
``utils`` -> ``errors``; ``data`` imports only ``utils`` and ``errors``. The modules of the
flat layout before 0.2 (``slimming.graph``, ``slimming.checkpoint``, ...) still import, as
aliases of their new homes (``OLD_PATHS``), until 0.3.
"""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

from .errors import CheckpointError, DataError, SlimmingError
from .io.checkpoint import checkpoint_dict, load_checkpoint, load_model, save_checkpoint
from .io.pruned import load_pruned, save_pruned
from .measure.stats import count_flops, count_params, model_stats
from .models.layers import LayerRule, register_layer
from .pruning import importance
from .pruning import prune as _prune_module
from .pruning.prune import PruneResult, prune
from .pruning.select import channel_masks, prunable_bns
from .training.sparsity import BNSparsity, add_l1_subgradient
from .version import __version__

# the flat layout's module paths -> where each module lives now (kept for one release)
OLD_PATHS = {
    "files": "utils.files", "devices": "utils.devices", "checkpoint": "io.checkpoint",
    "safeload": "utils.safeload", "compat": "io.paper", "structure": "io.structure",
    "stats": "measure.stats", "prune": "pruning.prune", "budget": "pruning.budget",
    "graph": "pruning.graph", "surgery": "pruning.surgery", "repair": "pruning.repair",
    "importance": "pruning.importance", "engine": "training.engine",
    "sparsity": "training.sparsity", "distributed": "training.distributed",
    "runs": "training.runs", "imagefolder": "data.imagefolder", "images": "data.images",
    "loaders": "data.loaders", "packed": "data.packed", "recipes": "data.recipes",
    "export": "tools.export", "sweep": "tools.sweep", "report": "tools.report",
    "plots": "tools.plots", "commands": "cli.commands", "pipeline": "cli.pipeline",
}


class _OldPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import slimming.graph`` gives the module ``slimming.pruning.graph`` itself (one object,
    so patching either name patches both)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(__name__ + ".") and fullname[len(__name__) + 1:] in OLD_PATHS:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        new = f"{__name__}.{OLD_PATHS[spec.name[len(__name__) + 1:]]}"
        warnings.warn(f"{spec.name} is {new} since 0.2 (the old path goes in 0.3): import {new}; "
                      "README, Upgrading, lists the names that moved", FutureWarning, stacklevel=2)
        module = importlib.import_module(new)
        spec.loader_state = module.__spec__  # importlib sets __spec__ to the alias's: put it back
        return module

    def exec_module(self, module):
        module.__spec__ = module.__spec__.loader_state

    def get_code(self, fullname):  # python -m slimming.graph: a module, not a program
        raise ImportError(f"{fullname} is {__name__}.{OLD_PATHS[fullname[len(__name__) + 1:]]} since 0.2, "
                          "a module and not a program: the commands are `slimming --help`")


sys.meta_path.append(_OldPaths())
sys.modules[__name__ + ".prune"] = _prune_module  # the name is the function; the module keeps its path

__all__ = ["__version__", "BNSparsity", "importance", "CheckpointError", "DataError", "LayerRule",
           "PruneResult", "SlimmingError", "register_layer",
           "add_l1_subgradient", "channel_masks", "checkpoint_dict", "count_flops", "count_params",
           "load_checkpoint", "load_model", "load_pruned", "model_stats", "prunable_bns", "prune",
           "save_checkpoint", "save_pruned"]
