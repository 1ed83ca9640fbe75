"""slimming: network slimming (Liu et al., ICCV 2017) for PyTorch.

Train with an L1 penalty on the scaling factors, the BatchNorm and GroupNorm gammas
(``Sparsity``, also known as ``BNSparsity``), cut the channels under a global
|gamma| threshold (``prune``), fine-tune, and reload any checkpoint with ``load_model``. Every
mistake in the input raises ``SlimmingError`` (a ValueError) with a one-line message.

The parts, as folders, and which may import which: the table in ``docs/layout.md``, the one
place the rule is written (``tests/test_layout.py`` holds it equal to what it enforces). The
modules of the flat layout before 0.2 (``slimming.graph``, ``slimming.checkpoint``, ...) and the
layer modules once in ``slimming.models`` (``slimming.models.layers``, ...) still import, as
aliases of their new homes (``OLD_PATHS``), until 0.3.
"""

import importlib
import importlib.abc
import importlib.util
import os
import sys
import types
import warnings

from .errors import CheckpointError, DataError, SlimmingError
from .version import __version__

_STALE = os.path.join(os.path.dirname(__file__), "models")
if os.path.isdir(_STALE) and not os.path.exists(os.path.join(_STALE, "__init__.py")):
    # a checkout from before the families moved to the top-level models/ folder keeps its
    # caches in slimming/models/, which Python would then import as an empty slimming.models
    raise ImportError(f"{_STALE} is left over from an older checkout (the networks are the top-level "
                      "models/ folder now): delete it")

# the package's face, imported when first used (PEP 562), so that ``slimming --help`` and the
# parts that need no torch start at once: name -> the module that defines it
API = {
    "checkpoint_dict": "io.checkpoint", "load_checkpoint": "io.checkpoint", "load_model": "io.checkpoint",
    "save_checkpoint": "io.checkpoint", "load_pruned": "io.pruned", "save_pruned": "io.pruned",
    "count_flops": "measure.stats", "count_params": "measure.stats", "model_stats": "measure.stats",
    "compare_stats": "measure.stats", "MeasuredLatency": "measure.latency",
    "CountBudget": "pruning.records", "LatencyBudget": "pruning.records",
    "LayerRule": "layers.rules", "register_layer": "pruning.register", "unfreeze_batchnorms": "layers.rules",
    "PruneResult": "pruning.records", "prune": "pruning.prune", "channel_masks": "pruning.select",
    "add_gates": "pruning.gates", "register_op": "pruning.register",
    "prunable_bns": "pruning.select", "prunable_factors": "pruning.select",
    "BNSparsity": "training.sparsity", "Sparsity": "training.sparsity",
    "add_l1_subgradient": "training.sparsity",
}
MODULES = {"importance": "pruning.importance", **{part: part for part in (
    "cli", "data", "io", "layers", "measure", "models", "pruning", "tools", "training", "utils")}}


def __getattr__(name: str):
    if name in MODULES:
        return importlib.import_module(f"{__name__}.{MODULES[name]}")
    if name not in API:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(f"{__name__}.{API[name]}")
    if name == "prune":  # the name is the function; ``import slimming.prune`` is still its module
        sys.modules.setdefault(f"{__name__}.prune", module)
    globals()[name] = value = getattr(module, name)
    return value


def __dir__():
    return sorted({*globals(), *API, *MODULES})


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
    # after 0.2.0, what slimming knows about layers left the network families (slimming.models)
    "models.layers": "layers.rules", "models.gates": "layers.gates", "models.baked": "layers.baked",
    "models.attention": "layers.attention",
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
        warnings.warn(f"{spec.name} is {new} now (the old path goes in 0.3): import {new}; "
                      "README, Upgrading, lists the names that moved", FutureWarning, stacklevel=2)
        module = importlib.import_module(new)
        spec.loader_state = module.__spec__  # importlib sets __spec__ to the alias's: put it back
        return module

    def exec_module(self, module):
        module.__spec__ = module.__spec__.loader_state

    def get_code(self, fullname):  # python -m slimming.graph: a module, not a program
        raise ImportError(f"{fullname} is {__name__}.{OLD_PATHS[fullname[len(__name__) + 1:]]} now, "
                          "a module and not a program: the commands are `slimming --help`")


class _Package(types.ModuleType):
    def __setattr__(self, name, value):
        if name == "prune" and isinstance(value, types.ModuleType):
            return  # ``import slimming.prune`` (0.1's module) leaves ``slimming.prune`` the function
        super().__setattr__(name, value)


sys.meta_path.append(_OldPaths())
sys.modules[__name__].__class__ = _Package

__all__ = ["__version__", "BNSparsity", "Sparsity", "add_gates", "importance", "CheckpointError", "DataError",
           "LayerRule", "PruneResult", "SlimmingError", "register_layer", "register_op",
           "CountBudget", "LatencyBudget", "MeasuredLatency", "compare_stats",
           "add_l1_subgradient", "channel_masks", "checkpoint_dict", "count_flops", "count_params",
           "load_checkpoint", "load_model", "load_pruned", "model_stats", "prunable_bns", "prunable_factors",
           "prune", "save_checkpoint", "save_pruned", "unfreeze_batchnorms"]
