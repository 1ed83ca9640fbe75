"""Which integer widths a cut sets stay, and the check that vouches for them.

A cut sets integer attributes that held a width it changed (``surgery.update_widths``): the
sure ones (a depthwise filter's groups, an attention's number of heads) must follow their
channels; the others matched a width by value and a forward may read them as fixed sizes.
``checked`` runs the check (``verify.check``) with them, at a second input size where a
forward may read a width as a number, and where it fails puts back first those of the module
the check blames (``_blamed``, at most 8 rounds), then tries each module's in turn (``settle``,
at most 16 modules); the widths put back are named in one warning. With ``verify=False``
``settle`` keeps only the sure ones.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

from torch import nn

from ..errors import first_line
from ..utils import progress
from .graph import GraphError
from .records import PruneResult
from .surgery import WidthChange
from .verify import check, check_second, named, second_size


def checked(model: nn.Module, result: PruneResult, example, output_transform=None,
            check_inputs: tuple = ()) -> float:
    """``verify.check``, and where the cut set integer widths the forward reads as sizes (the
    sure ones: a reshape's, a split's, a number of heads) or baked a weight a forward computed
    (``PruneResult.baked``) at a second input size too (``verify.second_size``: such a width may
    also be read as a number, such a weight computed from the input's size). Where it fails and
    other integer widths were set (the forward reads some as fixed sizes, not as the widths they
    matched), those of the module the check blames (and of modules inside it) are put back while
    that makes it pass (``_blamed``), else each module's tried in turn (``settle``): at the
    example's size (a check of two sizes for each made a TinyViT's prune 7x the peer's); then the
    whole at both sizes, else with none of them. ``check_inputs``: the user's own batches,
    compared on as they are too (``verify.check``'s ``given``)."""
    # a baked weight may also be computed from the input's size (a Python number): another size shows it
    smaller = second_size(example) if any(c.sure for c in result.widths) or result.baked else None

    def quick() -> float:
        diff = check(model, result, example, output_transform=output_transform)
        for batch in check_inputs:  # what the user's data takes, which noise may not
            diff = max(diff, check(model, result, batch, output_transform=output_transform, given=True))
        return max(diff, _on_images(model, result, example, output_transform)) if result.value_reads else diff

    def test() -> float:
        return max(quick(), check_second(model, result, smaller, output_transform)
                   if smaller is not None else 0.0)
    try:
        return test()
    except GraphError as e:
        if not any(not c.sure for c in result.widths):
            raise
        error = e
    widths = list(result.widths)
    if not _blamed(result, quick, error):
        _set(result, [c for c in widths if not c.sure], new=False)
        quick()  # wrong whatever the widths: the GraphError stands
        settle(result, quick)
    try:
        return test()
    except GraphError:
        if smaller is None:
            raise
    _set(result, [c for c in widths if not c.sure], new=False)  # none kept: they failed at the second size
    result.widths = [c for c in widths if c.sure]
    return test()


def _on_images(model: nn.Module, result: PruneResult, example, output_transform=None) -> float:
    """The check on images in [0, 1], for a forward that reads values computed from its input
    (``if x.mean() > 0.3``): the path normal noise takes may not be the one images take."""
    try:
        return check(model, result, example, output_transform=output_transform, images=True)
    except GraphError as e:
        where = ", ".join(n or "the model's forward" for n in result.value_reads[:3])
        raise named(GraphError(f"{first_line(e, 200)} (on images in [0, 1], not on noise: {where} reads "
                               "values of its input, and images take a path noise does not)"),
                    getattr(e, "module", None) or "the model") from None


def _set(result: PruneResult, changes, new: bool) -> None:
    for c in changes:
        setattr(result.model.get_submodule(c.module), c.attr, c.new if new else c.old)


def _leave(result: PruneResult, left: list[WidthChange], why: str) -> None:
    """``left`` (put back by the caller) out of ``result.widths``, named in one warning."""
    result.widths = [c for c in result.widths if c not in left]
    names = ", ".join(f"{c.module}.{c.attr}" if c.module else c.attr for c in left[:6])
    warnings.warn(f"{len(left)} integer attribute(s) left as they were ({why}): {names}", stacklevel=5)


def _blamed(result: PruneResult, test: Callable[[], object], error: GraphError, most: int = 8) -> bool:
    """Put back the integer widths (not the sure ones) of the module ``error`` names and of the
    modules inside it, and test again, while the check blames a module with such widths (at
    most ``most`` times); True once it passes (the widths put back named in one warning), False
    where the blame names no such module (nothing put back is left so)."""
    left, back = [c for c in result.widths if not c.sure], []
    for _ in range(most):
        at = getattr(error, "module", None)
        blamed = [c for c in left if at is not None and (c.module == at or c.module.startswith(at + "."))]
        if not blamed:
            break
        _set(result, blamed, new=False)
        left, back = [c for c in left if c not in blamed], back + blamed
        try:
            test()
        except GraphError as e:
            error = e
            continue
        _leave(result, back, "the forward reads them as fixed sizes")
        return True
    _set(result, back, new=True)
    return False


def settle(result: PruneResult, test: Callable[[], object], most: int = 16,
            keep: Callable[[WidthChange], bool] | None = None) -> None:
    """Put every integer width ``update_widths`` set back but the sure ones (a depthwise
    filter's groups, an attention's number of heads: they must follow their channels), then
    set each module's again where ``test`` (the check) still passes with it, for at most
    ``most`` modules; ``keep``: the changes kept without asking (with ``verify=False``, the
    sure ones only). Says which stay as they were."""
    by_module: dict[str, list] = {}
    for change in result.widths:
        by_module.setdefault(change.module, []).append(change)
    kept = [c for c in result.widths if c.sure]  # a depthwise filter's groups, a number of heads
    _set(result, [c for c in result.widths if not c.sure], new=False)
    if keep is not None:
        kept = [c for c in result.widths if keep(c)]
        _set(result, kept, new=True)
        why = "verify=False: only the check vouches for them"
    else:
        for module, changes in list(by_module.items())[:most]:
            progress.at(f"check: the widths of {module}")
            changes = [c for c in changes if not c.sure]
            _set(result, changes, new=True)
            try:
                test()
                kept += changes
            except Exception:  # noqa: BLE001 (this module's widths break the forward: back)
                _set(result, changes, new=False)
        why = "the forward reads them as fixed sizes"
    _leave(result, [c for c in result.widths if c not in kept], why)
