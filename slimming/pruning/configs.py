"""A Hugging Face model's ``config`` after a cut: ``save_pretrained`` writes it and
``from_pretrained`` builds from it, so where the cut left a width the config names uniform
(every MLP's ``intermediate_size``), the pruned model's config is set to it, and where it
cannot say the widths (they differ per layer; heads cut where the config derives their size
from ``hidden_size``), one warning points to ``save_pruned``/``load_pruned``.

Which tensors a field sizes is found by building the model's class from its config twice on
the meta device (no memory, no weights), the field as it is and changed by one; the update is
kept only where the class built from the new config has every shape of the pruned model and
the pruned model computes the same with it (a forward that reads the config is not changed);
the pruned model gets a config of its own, the original keeps its.
"""

from __future__ import annotations

import copy
import warnings

import torch
from torch import nn

from ..utils.modules import modes_kept
from .ops import leaves
from .repair import probe_like

# the integer fields of Hugging Face configs that are widths
WIDTHS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
          "embed_dim", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "d_model", "d_ff", "d_kv",
          "num_heads", "mlp_dim")


def said_widths(original: nn.Module, pruned: nn.Module, example) -> str | None:
    """Sets the fields of ``pruned.config`` (a Hugging Face model's: it has ``save_pretrained``)
    that the cut changed uniformly; the warning where the config cannot say the pruned widths,
    else None. Models without such a config, or whose class is not built from it alone, are
    left as they are."""
    config = getattr(pruned, "config", None)
    if not callable(getattr(pruned, "save_pretrained", None)) or config is None:
        return None
    want, base = _shapes(pruned), _built(type(pruned), config)
    if base is None or base == want:
        return None
    changes, unsaid = {}, []
    for field in WIDTHS:
        value = getattr(config, field, None)
        if type(value) is not int or value < 1:
            continue
        where = _sized_by(type(pruned), config, field, value, base)
        seen = {want[k][d] for k, d in where if k in want and len(want[k]) > d}
        if len(seen) == 1 and value not in seen:
            changes[field] = seen.pop()
        elif len(seen) > 1:
            unsaid.append(f"{field} {value}: the layers have {sorted(seen)}")
    said = _with(config, changes) if changes else None
    if said is not None and _built(type(pruned), said) == want and _same(pruned, config, said, example):
        return None
    if not unsaid:
        key = next(k for k in want if base.get(k) != want[k])
        unsaid.append(f"{key} is {want[key]}, where the config builds {base.get(key)}")
    return (f"model.config does not say the pruned widths ({'; '.join(unsaid[:2])}), so save_pretrained and "
            "from_pretrained cannot round-trip the pruned model: save it with slimming.save_pruned and load "
            "it with slimming.load_pruned onto a model built from this config")


def _shapes(model: nn.Module) -> dict[str, tuple]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def _built(cls: type, config) -> dict[str, tuple] | None:
    """The shapes of ``cls(config)``, built on the meta device; None where it cannot be."""
    try:
        with warnings.catch_warnings(), torch.device("meta"):
            warnings.simplefilter("ignore")
            return _shapes(cls(config))
    except Exception:  # noqa: BLE001 (a class built from more than its config: not followed)
        return None


def _with(config, changes: dict):
    trial = copy.deepcopy(config)
    for field, value in changes.items():
        setattr(trial, field, value)
    return trial


def _sized_by(cls: type, config, field: str, value: int, base: dict) -> list[tuple[str, int]]:
    """The (tensor, dimension) pairs whose size is ``field``'s: ``value`` as built, and the
    changed value where the field is changed."""
    for other in (value + 1, 2 * value):
        changed = _built(cls, _with(config, {field: other}))
        if changed is not None:
            return [(k, d) for k, shape in base.items() if len(changed.get(k, ())) == len(shape)
                    for d, n in enumerate(shape) if n == value and changed[k][d] == other]
    return []


@torch.no_grad()
def _same(pruned: nn.Module, config, said, example) -> bool:
    """Every module of ``pruned`` holding ``config`` (the original's too: a cut copies modules,
    not their config) given ``said`` instead, where the pruned model computes the same with it
    (on a probe of the example's shape); else ``config`` put back and False."""
    holders = [m for m in pruned.modules() if vars(m).get("config") is config]
    inputs = probe_like(example)
    try:
        with modes_kept(pruned):  # which puts back every attribute set inside it
            want = [t.clone() for t in leaves(pruned.eval()(*inputs))]
        for m in holders:
            m.config = said
        with modes_kept(pruned):
            got = leaves(pruned.eval()(*inputs))
        if len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want)):
            return True
    except Exception:  # noqa: BLE001 (a forward the new fields break: they are not kept)
        pass
    for m in holders:
        m.config = config
    return False
