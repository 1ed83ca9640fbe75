"""What a training run writes, apart from the loop that trains (as timm's ``CheckpointSaver``):
one JSON line per epoch to ``metrics.jsonl``, ``last.pth`` every epoch and ``best.pth`` on a new
best test accuracy (and after the first epoch whatever its accuracy: a run that scored 0% still
has a best.pth to prune or resume from), every file written atomically (``slimming.utils.files``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch import nn

from ..io.checkpoint import checkpoint_dict, save_checkpoint
from ..utils.files import append_line


class CheckpointSaver:
    """Writes the files of the run in ``folder``; ``extra`` goes into every checkpoint (the
    run's arguments, its data record, a pruned network's masks). Only rank 0 should have one."""

    def __init__(self, folder: str | Path, extra: dict[str, Any] | None = None):
        self.folder, self.extra = Path(folder), dict(extra or {})

    def save(self, model: nn.Module, row: dict[str, Any], state: dict[str, Any], *, best_acc: float,
             is_best: bool) -> None:
        """The epoch's metrics ``row`` (its "epoch" and "test_acc" among them) and the checkpoint
        of ``model`` with the training ``state`` (optimizer, scheduler, ...) that resumes it."""
        # the row first: a kill before last.pth leaves a row that --resume drops and redoes
        # (keep_metrics), never a checkpoint whose epoch has no row
        append_line(self.folder / "metrics.jsonl", json.dumps(row))
        ckpt = checkpoint_dict(model, epoch=row["epoch"], acc=row["test_acc"], best_acc=best_acc,
                               **state, **self.extra)
        save_checkpoint(ckpt, self.folder / "last.pth")
        if is_best or not (self.folder / "best.pth").exists():
            save_checkpoint(ckpt, self.folder / "best.pth")
