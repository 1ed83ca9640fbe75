"""Never hand back a wrong network: ``check`` runs the pruned network against its reference, the
original with the cut channels' gamma and beta zeroed in every factor layer (BatchNorm,
GroupNorm, LayerNorm: a LayerNorm that loses channels normalising over its kept ones, ``norms``;
what the graph promises it equals, before compensation changes anything), on one random input of the
example's shape. A difference is a GraphError naming the first module whose outputs differ
(forward hooks on both networks); a pruned network that does not run is one naming the module
it failed in. Two forwards when the networks agree (the usual case), two more to find the
module when they do not.

The model's outputs alone can agree while a block deep inside is wrong: a residual branch
whose share of the output is small (an attention at a random start, its projection's weights
near zero) moves the output by less than the tolerance however wrong it is. So the same two
forwards also fingerprint every module's outputs (two numbers each, ``fingerprints``), on the
kept channels where the cut narrowed them, and a module whose fingerprint differs from its
reference's by more than the tolerance, relative to its own size, fails the check too.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from ..errors import first_line
from ..utils.modules import hooked, modes_kept
from .capture import ShapesOnly, blank
from .graph import GraphError
from .norms import kept_statistics
from .ops import leaves, picker
from .repair import probe_like
from .trace import as_inputs, images_like

TOLERANCE = 1e-3  # largest |pruned - reference| over the reference's largest |value|, per output


class _Failed(Exception):
    def __init__(self, module: str, error: str):
        super().__init__(error)
        self.module, self.error = module, error


@contextlib.contextmanager
def zeroed(model: nn.Module, masks: dict[str, torch.Tensor]):
    """``model`` with gamma and beta zeroed where ``masks`` (factor layer name -> keep) cut, and
    its LayerNorms that lose channels normalising over the kept ones (``norms``); put back when
    the block ends, whatever happens."""
    saved = []
    try:
        with torch.no_grad():
            for name, keep in masks.items():
                bn = model.get_submodule(name)
                if bool(keep.all()):
                    continue
                cut = ~keep
                for t in (bn.weight, getattr(bn, "bias", None)):
                    if t is not None:  # the cut slices along dim 0 (t[~keep] = 0), one kernel
                        saved.append((t, t.detach().clone()))
                        t.detach().masked_fill_(cut.to(t.device).view(-1, *[1] * (t.dim() - 1)), 0)
        with kept_statistics(model, masks):
            yield model
    finally:
        with torch.no_grad():
            for t, value in saved:
                t.detach().copy_(value)


def difference(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    """The largest relative difference between two lists of outputs (inf where their number
    or shapes differ)."""
    if len(got) != len(want) or any(a.shape != b.shape for a, b in zip(got, want)):
        return float("inf")
    worst = 0.0
    for a, b in zip(got, want):
        if a.numel():
            a, b = a.detach().double(), b.detach().double()
            worst = max(worst, float((a - b).abs().max() / b.abs().max().clamp_min(1e-12)))
    return worst


@torch.no_grad()
def check(original: nn.Module, result, example, tolerance: float = TOLERANCE, output_transform=None,
          images: bool = False, given: bool = False) -> float:
    """The largest relative difference between ``result.model`` and ``original`` with
    ``result.masks``' cut channels zeroed, on a random input of the example's shape (normal
    noise; ``images``: images in [0, 1], ``trace.images_like``); GraphError (the model left as
    it was) where it exceeds ``tolerance`` or the pruned network fails. ``output_transform``:
    what of the model's output is compared (``prune``'s). ``given``: ``example`` is real inputs
    (``prune``'s ``check_inputs``), compared on as they are."""
    inputs = as_inputs(example) if given else \
        images_like(as_inputs(example)) if images else probe_like(example)
    pick = picker(output_transform)
    pruned = result.model
    kept = {**result.masks, **{n: m["out"] for n, m in result.layers.items() if "out" in m}}
    with modes_kept(original), modes_kept(pruned), zeroed(original, result.masks):
        for model in (original, pruned):
            if any(m.training for m in model.modules()):
                model.eval()
        with fingerprints(pruned) as ours:  # first: the reference's then takes only the forms it has
            got = leaves(pick(_forward(pruned, inputs)))
        with fingerprints(original, kept, ours) as theirs:
            want = leaves(pick(original(*inputs)))
        diff = difference(got, want)
        inner = inner_differences(ours, theirs, tolerance) if diff <= tolerance else []
        if diff <= tolerance and not inner:
            return diff
        # a difference: real, or a discrete step (top-k proposals among near ties, NMS) that
        # float rounding alone flips; those steps are found by nudging the original's weights
        reference = _outputs(original, inputs, pick)
        with nudged(original):
            moved = _outputs(original, inputs, pick)
        jumps = {n for n, outs in reference[1].items()
                 if difference(moved[1].get(n, []), outs) > tolerance / 10}
        real = [(name, d) for name, d in inner if name not in jumps]  # a module that stays put differs
        if real:
            raise differs(real[0][1], real[0][0] or "the model's output")
        if jumps:
            worst = stable_difference(pruned, inputs, reference, moved, tolerance, kept, pick)
            return max(worst, diff if inner else 0.0)
        where = first_difference(pruned, inputs, reference, tolerance, kept, pick)
    raise differs(diff, where)


def second_size(example):
    """The example at about three quarters of its height and width (each image-like input, (N,
    C, H, W) or longer); None where it has none. A width the cut set may also be read as a
    number (``if x.shape[-1] < self.c``): only another size shows it (``check_second``)."""
    inputs, changed = [], False
    for t in (example if isinstance(example, (tuple, list)) else (example,)):
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim() >= 4 and min(t.shape[2:]) > 1:
            t = t.new_zeros(*t.shape[:2], *(max(1, n * 3 // 4) for n in t.shape[2:]))
            changed = True
        inputs.append(t)
    if not changed:
        return None
    return tuple(inputs) if isinstance(example, (tuple, list)) else inputs[0]


def check_second(original: nn.Module, result, smaller, output_transform=None) -> float:
    """``check`` at ``second_size``'s example, where the original runs at that size (a network
    of one input size has nothing to compare there: 0.0). Whether it runs is asked only where
    the check fails, so that a passing check costs no extra forward of the original."""
    try:
        return check(original, result, smaller, output_transform=output_transform)
    except Exception:  # noqa: BLE001 (the original's own forward failing there is no refusal)
        try:
            with torch.no_grad(), modes_kept(original):
                original.eval()(*probe_like(smaller))
        except Exception:  # noqa: BLE001 (a network of one input size)
            return 0.0
        raise


@torch.no_grad()
def runs(result, example) -> None:
    """What ``verify=False`` still asks: ``result.model`` runs, in eval mode, on a random input
    of the example's shape (one forward of the pruned network); GraphError naming the module
    it fails in where it does not, as ``check`` says it. On a blank example (all zeros, as
    ``default_example`` makes) of a forward that read no values into Python
    (``result.value_reads``), it runs on that example as the trace ran the original, its
    convolutions giving zeros of their output's shape (``capture.ShapesOnly``): the same calls
    at the same shapes, which is what a cut can get wrong, without their arithmetic."""
    pruned, inputs = result.model, as_inputs(example)
    with modes_kept(pruned):
        if blank(inputs) and not result.value_reads:
            with ShapesOnly():
                _forward(pruned.eval(), inputs)
        else:
            _forward(pruned.eval(), probe_like(example))


def _forward(pruned: nn.Module, inputs: tuple):
    """``pruned(*inputs)``; where it fails, GraphError naming the module it failed in (found by
    running it once more with hooks)."""
    try:
        return pruned(*inputs)
    except Exception:  # noqa: BLE001 (any failure of the pruned network is reported)
        pass
    try:
        return _run_named(pruned, inputs)
    except _Failed as e:
        raise named(GraphError(f"slimming refused its own cut: the pruned network fails in {e.module} "
                               f"({e.error}); please report the network, and list that module in "
                               "keep_whole= meanwhile"), e.module) from None


def differs(diff: float, where: str) -> GraphError:
    return named(GraphError(f"slimming refused its own cut: the pruned network differs from the original "
                            f"with the cut channels zeroed by {diff:.3g} (relative), first in {where}; "
                            "please report the network, and list that module in keep_whole= meanwhile"),
                 where)


def named(error: GraphError, module: str) -> GraphError:
    """``error`` with ``module``: the module the check found at fault (None where it is the
    model as a whole), so that ``prune`` can cut again with it kept."""
    error.module = None if module.startswith("the model") else module
    return error


def _run_named(model: nn.Module, inputs: tuple):
    """``model(*inputs)``; a failure names the innermost module it happened in."""
    stack = []

    def enter(name):
        def hook(m, args) -> None:
            stack.append(name)
        return hook

    def leave(m, args, out) -> None:
        if stack:
            stack.pop()

    named = list(model.named_modules())
    with hooked(pre=[(m, enter(name)) for name, m in named], post=[(m, leave) for _, m in named]):
        try:
            return model(*inputs)
        except Exception as e:  # noqa: BLE001 (any failure of the pruned network is reported)
            name = stack[-1] if stack and stack[-1] else "the model's forward"
            raise _Failed(name, first_line(e, 160)) from None


@contextlib.contextmanager
def nudged(model: nn.Module, scale: float = 1e-6):
    """``model`` with every floating parameter and buffer moved by noise a million times
    smaller than it (float rounding's size), put back when the block ends."""
    gen = torch.Generator().manual_seed(1)
    saved = [(t, t.detach().clone()) for t in (*model.parameters(), *model.buffers())
             if t.is_floating_point() and t.numel()]
    try:
        with torch.no_grad():
            for t, value in saved:
                noise = torch.randn(t.shape, generator=gen).to(t.device, t.dtype)
                t.add_(noise * value.abs() * scale)
        yield model
    finally:
        with torch.no_grad():
            for t, value in saved:
                t.copy_(value)


def _outputs(model: nn.Module, inputs: tuple, pick=None) -> tuple[list[str], dict[str, list[torch.Tensor]]]:
    """Every module's outputs on ``inputs`` (the first call of each), in the order they finish;
    the model's own (``""``) as ``pick`` takes them (``output_transform``)."""
    order, outs = [], {}

    def seen(name):
        def hook(m, args, out):
            if name not in outs:
                order.append(name)
                outs[name] = [t.detach().clone() for t in leaves(pick(out) if pick and not name else out)]
        return hook

    with hooked(post=[(m, seen(name)) for name, m in model.named_modules()]):
        model(*inputs)
    return order, outs


def _narrowed(ref: list[torch.Tensor], mask: torch.Tensor | None) -> list[torch.Tensor]:
    """A module's reference outputs on the channels the cut kept, where it narrowed them."""
    if mask is not None and len(ref) == 1 and ref[0].dim() >= 2 and ref[0].shape[1] == len(mask):
        return [ref[0][:, mask.to(ref[0].device)]]
    return ref


def stable_difference(pruned: nn.Module, inputs: tuple, reference, nudged_outputs,
                      tolerance: float, kept: dict[str, torch.Tensor], pick=None) -> float:
    """For a network some of whose modules' outputs jump when its weights move by float
    rounding's size (discrete steps: non-maximum suppression, top-k proposals among near ties,
    sorting), the outputs are compared module by module wherever the original's own
    (``reference``: ``_outputs`` of the zeroed original) stay put under that nudge: GraphError
    at the first such module whose outputs differ; else the largest difference among them."""
    order, want = reference
    _, moved = nudged_outputs
    _, got = _outputs(pruned, inputs, pick)
    worst, compared = 0.0, 0
    for name in order:
        if name not in got or difference(moved.get(name, []), want[name]) > tolerance / 10:
            continue  # after a discrete step: not comparable
        diff = difference(got[name], _narrowed(want[name], kept.get(name)))
        if diff == float("inf"):
            continue
        if diff > tolerance:
            raise differs(diff, name or "the model")
        worst, compared = max(worst, diff), compared + 1
    if not compared:  # nothing stayed put to compare: nothing vouched for
        raise differs(float("inf"), "the model")
    return worst


@contextlib.contextmanager
def fingerprints(model: nn.Module, kept: dict[str, torch.Tensor] | None = None, shapes: dict | None = None):
    """Yields {module: (shape, fingerprint) of each floating output} for the first call of
    every module of ``model`` in the block; ``kept`` (module -> keep-mask of its output
    channels): those modules' outputs are fingerprinted on every way the mask can narrow them
    (along dim 1, or the last dim of channels-last tokens), as the pruned network has them;
    ``shapes`` (the pruned network's fingerprints, taken first): only on the ways that give
    the shape the pruned network's output has there, where it has one. A
    fingerprint is two numbers, whatever the output's size (``_fingerprint``). A container's
    output, the same tensor as its last child's, is not fingerprinted twice. Each is taken when
    its module returns, so a tensor an in-place op changes later is seen as it was then."""
    found: dict[str, list[list[tuple[tuple, torch.Tensor]]]] = {}
    last: dict = {}
    narrow = {name: mask.nonzero().flatten() for name, mask in (kept or {}).items() if not bool(mask.all())}

    def forms_of(name: str, out) -> list[list[tuple[tuple, torch.Tensor]]]:
        variants, index = [], narrow.get(name)
        for t in leaves(out):
            if not (isinstance(t, torch.Tensor) and t.is_floating_point()):
                variants.append([])
                continue
            if index is None and shapes is not None and _shapes_at(shapes, name, len(variants)) \
                    not in (None, {tuple(t.shape)}):
                variants.append([])  # the pruned network's has another shape: nothing to compare
                continue
            if index is None or t.dim() < 2:
                # a container passing on its child's output, unchanged since (no in-place
                # activation after it: ``_version``), is not fingerprinted again
                if last.get("tensor") is not t or last.get("version") != t._version:
                    last.update(tensor=t, version=t._version, form=[(tuple(t.shape), _fingerprint(t))])
                variants.append(last["form"])
                continue
            ways = [None] + [d for d in sorted({1, t.dim() - 1}) if t.shape[d] == len(kept[name])]
            wanted = _shapes_at(shapes, name, len(variants))
            if wanted is not None:  # only the ways that give the pruned network's shape
                ways = [d for d in ways if _narrowed_shape(t, d, len(index)) in wanted]
            forms = [t if d is None else t.index_select(d, index.to(t.device)) for d in ways]
            variants.append([(tuple(f.shape), _fingerprint(f)) for f in forms])
        return variants

    # an activation's output is its input's, element by element: where that input is right, so
    # is the activation's, and it cannot be where a wrong cut starts; a Sequential's is its last
    # child's (or an activation's of the one before), fingerprinted there
    names = {id(m): name for name, m in model.named_modules()
             if not name or not (type(m) in ELEMENTWISE or type(m).forward is nn.Sequential.forward)}

    def record(m, args, out) -> None:
        name = names.get(id(m))
        if name is not None and name not in found:
            found[name] = forms_of(name, out)

    handle = torch.nn.modules.module.register_module_forward_hook(record)  # one hook, not one a module
    try:
        yield found
    finally:
        handle.remove()
        last.clear()
        for device, signs in list(_SIGNS.items()):  # kept for the next check, up to 64 MiB each
            if signs.numel() > _KEEP_SIGNS:
                del _SIGNS[device]
        if sum(s.numel() for s in _PERMUTED.values()) > _KEEP_SIGNS:
            _PERMUTED.clear()


def _shapes_at(shapes: dict | None, name: str, i: int) -> set[tuple] | None:
    """The shapes of output ``i`` of module ``name`` in the pruned network's fingerprints."""
    outputs = (shapes or {}).get(name)
    if outputs is None or i >= len(outputs) or not outputs[i]:
        return None
    return {shape for shape, _ in outputs[i]}


def _narrowed_shape(t: torch.Tensor, d: int | None, n: int) -> tuple:
    shape = list(t.shape)
    if d is not None:
        shape[d] = n
    return tuple(shape)


ELEMENTWISE = (nn.Identity, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.ReLU,
               nn.ReLU6, nn.LeakyReLU, nn.ELU, nn.CELU, nn.SELU, nn.GELU, nn.SiLU, nn.Mish, nn.Hardswish,
               nn.Hardsigmoid, nn.Hardtanh, nn.Sigmoid, nn.Tanh, nn.Softplus, nn.Softsign, nn.Tanhshrink)
_SIGNS: dict[torch.device, torch.Tensor] = {}  # device -> a fixed random +-1 per position
_PERMUTED: dict[tuple, torch.Tensor] = {}  # (device, shape, memory order) -> those signs in that order
_KEEP_SIGNS = 1 << 24  # longer ones (a batch of large images) are made again the next time
_CHUNK = 1 << 16


def _fingerprint(t: torch.Tensor) -> torch.Tensor:
    """(sum of squares, dot product with fixed random signs) of ``t``, on its device. Where two
    tensors differ by d, their second numbers differ by about |d| (its spread over random
    signs), so that, against the square root of the first, it measures any change (values
    moved to other positions too) alike at every size. The signs are those of ``t``'s
    positions in row-major order whatever its memory layout; a permuted tensor (channels-last
    tokens of a (N, C, H, W) map) is read in its memory's order against signs laid out the
    same way (kept per shape and order), not copied."""
    t = t.detach().float()
    n = t.numel()
    signs = _signs(t.device, n)
    if t.is_contiguous():
        flat = t.view(-1)
    else:
        order = sorted(range(t.dim()), key=lambda d: -t.stride(d))
        p = t.permute(order)
        if p.is_contiguous():
            flat, key = p.view(-1), (t.device, tuple(t.shape), tuple(order))
            signs = _PERMUTED.get(key)
            if signs is None:
                signs = _PERMUTED[key] = _signs(t.device, n).view(t.shape).permute(order).reshape(-1)
        else:
            flat = t.reshape(-1)
    return torch.stack([flat.dot(flat), flat.dot(signs)])


def _signs(device: torch.device, n: int) -> torch.Tensor:
    """The first ``n`` of a fixed random +-1 per position (chunk i from seed i: the same signs
    at a position, however many)."""
    signs = _SIGNS.get(device)
    if signs is None:
        signs = torch.zeros(0, device=device)
    if len(signs) < n:
        more = [(torch.randint(0, 2, (_CHUNK,), generator=torch.Generator().manual_seed(i)) * 2 - 1).float()
                for i in range(len(signs) // _CHUNK, -(-n // _CHUNK))]
        signs = _SIGNS[device] = torch.cat([signs, torch.cat(more).to(device)])
    return signs[:n]


def inner_differences(ours: dict, theirs: dict, tolerance: float) -> list[tuple[str, float]]:
    """(module, difference) for every module, in the order modules finish, whose outputs'
    fingerprints differ from the reference's of the same shape by more than ``tolerance``
    (relative to the reference's sum of squares, and its root): the check's final
    outputs can agree while a block deep in a residual stream is wrong (a branch whose share
    of the output is small, as in a network at its random start). The model's own output is
    named ``""``."""
    names, got, want = [], [], []
    for name, outputs in ours.items():
        forms_of = theirs.get(name)
        if forms_of is None or len(forms_of) != len(outputs):
            continue
        for mine, forms in zip(outputs, forms_of):
            if not mine:
                continue
            shape, g = mine[0]
            same = [f for s, f in forms if s == shape]
            if len(same) == 1:  # else not comparable (narrowed another way), or ambiguous
                names.append(name)
                got.append(g)
                want.append(same[0])
    if not names:
        return []
    g, f = torch.stack(got).double().cpu(), torch.stack(want).double().cpu()  # all at once: one copy
    diff = torch.maximum((g[:, 0] - f[:, 0]).abs() / f[:, 0], (g[:, 1] - f[:, 1]).abs() / f[:, 0].sqrt())
    bad = ((f[:, 0] > 0) & (diff > tolerance)).nonzero().flatten().tolist()
    return [(names[i], float(diff[i])) for i in bad]


def first_difference(pruned: nn.Module, inputs: tuple, reference, tolerance: float,
                     kept: dict[str, torch.Tensor], pick=None) -> str:
    """The first module, in the order modules finish (the innermost first), whose outputs
    differ between the two networks: compared whole where their shapes agree, on the channels
    ``kept`` (module -> keep-mask of its output channels) where the cut narrowed them; the
    model's output when none does."""
    order, want = reference
    _, got = _outputs(pruned, inputs, pick)
    for name in order:
        if name in got and tolerance < difference(got[name], _narrowed(want[name], kept.get(name))) \
                < float("inf"):
            return name or "the model's output"
    return "the model's output"
