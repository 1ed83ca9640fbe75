"""Pruning a checkpoint file, as ``slimming prune`` does and Python callers can: load it (any
slimming checkpoint, or one of the paper's given its ``arch``), ``slimming.prune`` its network,
refuse a cut that removes nothing, and give the pruned checkpoint to save."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import SlimmingError
from ..io.checkpoint import checkpoint_dict, load_checkpoint, model_from_checkpoint
from ..pruning.prune import PruneResult, default_example, prune
from ..pruning.select import prunable_factors

HOW = ("percent", "threshold", "target_flops", "target_params", "target_latency")
LIMITS = (("min_channels", 1), ("round_to", 1), ("max_layer_prune", 1.0))


@dataclass
class PrunedCheckpoint:
    """What ``prune_checkpoint`` gives: the pruning (``result.model`` is the pruned network),
    the network it was cut from and the source file's fields."""

    result: PruneResult
    original: nn.Module
    source: dict
    path: str
    percent: float | None = None  # the percent asked for, if one was

    def removed(self) -> float:
        """The fraction of prunable channels cut."""
        table = self.result.layer_table()
        before = sum(b for _, b, _ in table)
        return (before - sum(a for _, _, a in table)) / before

    def checkpoint(self, **fields) -> dict:
        """The pruned checkpoint (rebuilds as ``Net(cfg)``, records its masks and its source);
        ``fields``: more to record (``data``, ``args``)."""
        r, src = self.result, self.source
        budget = r.budget.as_dict() if r.budget is not None else None
        if budget and isinstance(budget.get("table"), dict):  # not where this machine keeps its cache
            budget["table"] = {k: v for k, v in budget["table"].items() if k != "path"}
        return checkpoint_dict(r.model, cfg_mask=r.cfg_mask, layer_names=r.layer_names,
                               threshold=r.threshold,
                               percent=self.percent if self.percent is not None else self.removed(),
                               budget=budget, compensation=r.compensation or None,
                               source_acc=src.get("acc"),
                               source={"path": self.path, "acc": src.get("acc"), "epoch": src.get("epoch")},
                               **fields)


def prune_checkpoint(path: str | os.PathLike, *, device: str | torch.device = "cpu",
                     arch: str | None = None, depth: int | None = None, batch_size: int = 1,
                     **options) -> PrunedCheckpoint:
    """Load ``path`` onto ``device`` and prune its network with ``slimming.prune(**options)``
    (``percent``, ``threshold``, ``target_flops``, ``target_params`` or ``target_latency``, and
    the per-layer limits), on a batch of ``batch_size`` images of the model's input size (what
    a latency is measured at). ``arch``/``depth`` describe a file of the paper's code, which
    does not say them. Raises SlimmingError when the cut removes no channel."""
    ckpt = load_checkpoint(path, map_location=device, **({"arch": arch, "depth": depth} if arch else {}))
    model = model_from_checkpoint(ckpt, path)
    if batch_size > 1:
        one = default_example(model)
        options["example_inputs"] = one.repeat(batch_size, *[1] * (one.dim() - 1))
    result = prune(model, **options)  # rebuilt on ``device``
    if all(before == after for _, before, after in result.layer_table()):
        asked = next((k for k in HOW if options.get(k) is not None), "percent")
        how = f"{asked} {options.get(asked)}"
        limits = [name for name, default in LIMITS if options.get(name) not in (None, default)]
        if limits and (options.get("percent") or 0) > 0:  # the cut was asked for; the limits undid it
            given = " and ".join(f"{name} {options[name]}" for name in limits)
            raise SlimmingError(f"{how} prunes no channel once {given} put channels back: every layer "
                                f"keeps all of its channels; lower {'them' if len(limits) > 1 else 'it'} "
                                "or cut more", param=(asked, *limits))
        smallest = min(bn.weight.detach().abs().min().item() for bn in prunable_factors(model))
        raise SlimmingError(f"{how} prunes no channel (smallest prunable |gamma| {smallest:.4g}): "
                            "nothing to save; raise it", param=asked)
    return PrunedCheckpoint(result, model, ckpt, str(path), options.get("percent"))
