"""The one registry of network families: ``@register`` on a family's ``Net`` class is all it
takes to add one (``build(arch)``, checkpoints, the CLI's ``--arch`` and pruning find it here).

A family's ``Net(cfg=None, ...)`` carries, as class attributes:
- ``arch``: its name; ``aliases``: other names it answers to (the paper's ``resnet``);
- ``input_size``: the (C, H, W) it is built for (3x32x32 for the CIFAR families);
- ``surgery``: how pruning copies the kept weights into the thinner ``Net(cfg)``: ``"chain"``
  (conv -> BN -> ... -> linear, walked with ``start_mask``/``end_mask``, as the paper's code does)
  or ``"sliced"`` (the family lists per BN the tensors its mask cuts: ``channel_slices()``);
- ``read_structure(state_dict, depth)``: (options, cfg) as a state_dict's shapes say, for the
  paper's checkpoint files (None: the family has no paper files);
and, per instance, ``cfg``, ``options``, ``prunable_bns()`` and ``pruned_cfg(kept)``.
"""

from __future__ import annotations

from torch import nn

FAMILIES: dict[str, type[nn.Module]] = {}
ALIASES: dict[str, str] = {}
SURGERY_KINDS = ("chain", "sliced")
REQUIRED = ("arch", "input_size", "surgery", "prunable_bns", "pruned_cfg")


def register(net: type[nn.Module]) -> type[nn.Module]:
    """Add the family ``net`` (a class decorator); raises ValueError if it lacks a contract
    attribute or takes a name another class has (the same class defined again replaces itself)."""
    missing = [a for a in REQUIRED if not hasattr(net, a)]
    if missing:
        raise ValueError(f"{net.__qualname__} lacks {', '.join(missing)}: see slimming.models.registry")
    if net.surgery not in SURGERY_KINDS:
        raise ValueError(f"{net.arch}: surgery must be one of {SURGERY_KINDS}, got {net.surgery!r}")
    for name in (net.arch, *getattr(net, "aliases", ())):
        taken = FAMILIES.get(ALIASES.get(name, name))
        if ":" in name or (taken is not None and not _same_class(taken, net)):
            raise ValueError(f"the family name {name!r} is taken (or has a ':')")
    FAMILIES[net.arch] = net
    ALIASES.update({alias: net.arch for alias in getattr(net, "aliases", ())})
    return net


def _same_class(a: type, b: type) -> bool:
    """The same class defined again (its module reloaded, a notebook cell run twice)."""
    return (a.__module__, a.__qualname__) == (b.__module__, b.__qualname__)


def family(arch: str | None) -> type[nn.Module] | None:
    """The registered family ``arch`` (or an alias of it) names; None for any other name."""
    if not isinstance(arch, str):
        return None
    return FAMILIES.get(ALIASES.get(arch, arch))


def canonical(arch: str) -> str:
    """A family's own name for ``arch`` (``resnet`` -> ``preresnet``); other names as given."""
    return ALIASES.get(arch, arch)
