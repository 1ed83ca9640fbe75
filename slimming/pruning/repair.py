"""Repairs after a cut, so that pruning does not throw away what sparsity training bought.

``compensate`` (data-free, on by default). A channel whose gamma sparsity training drove to
zero still emits a constant: its BatchNorm gives beta everywhere, the activation act(beta),
pooling keeps it. The paper's surgery drops that constant with the channel; the layer that read
it then sees a shifted input (the paper's VGG-19 falls from 93.3% to 32.5% right after pruning).
Compensation adds it back where it belongs: a layer that read the cut channel c with weights W
received, at every output o, the constant ``sum_kh,kw W[o, c, kh, kw] * act(beta_c)``; that goes
into the layer's bias, or, for a layer without one that feeds a BatchNorm directly, into that
BatchNorm's running mean (subtracted: BN(z + d) with mean m equals BN(z) with mean m - d).
The constants are read off the original network itself: it is run on 2 random images with
the cut channels' gamma set to zero (the network sparsity training approaches), and what each
reader received from the cut channels is computed with its own weights and averaged over its
output positions (the same for both images, or the channel is not constant and is left; where
the input is one value over the map, from each tap's share of the positions, without running
the convolution). The folds are kept only if they bring the pruned network closer to that one
on those images. Three forwards in all: the original's, the pruned one's before the folds
(which also finds the BatchNorm after each reader) and after.
Exact where the reader is a 1x1 convolution or a linear layer (after pooling or flattening).
For a zero-padded kxk convolution the contribution is the same everywhere the kernel lies
inside the image and smaller at the border, where part of the kernel reads padding; the fold
is its average over the output, the single constant closest to it, so it is nearly exact on
large maps and never worse than leaving it out (in the least-squares sense) on small ones.
A reader with no bias and no BatchNorm right after (a convolution feeding a
residual sum or a concatenation) cannot take the fold: those channels stay as the paper leaves
them, and are counted.

``recalibrate_bn`` (data-based, optional): re-estimates every BatchNorm's running mean and
variance of the pruned network on a few training batches, without gradients or any weight
change.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from ..errors import SlimmingError
from ..utils.devices import full_precision
from ..utils.modules import hooked, modes_kept
from .norms import kept_statistics
from .ops import leaves, picker
from .trace import as_inputs

_BN = nn.modules.batchnorm._BatchNorm


@torch.no_grad()
@full_precision()  # the constants go into the file: not TF32's on CUDA
def compensate(original: nn.Module, result, example: torch.Tensor, probes: int = 2,
               output_transform=None) -> dict:
    """Fold the constant outputs of ``result``'s cut channels into ``result.model`` (in place);
    ``original`` is left as it was. Returns {"layers", "folded", "unfolded", "applied"}:
    readers folded into, channel inputs folded and left, and whether the folds were kept.

    The folds are kept only if they bring the pruned network closer to the original with the
    cut gammas at zero, measured on ``probes`` random images (through the nonlinearities that
    follow, a partial fold, with other channels left, can overshoot): otherwise they are undone
    and the network is the paper's. ``output_transform``: what of the outputs is compared.
    A forward that runs only at the example's own batch (``assert x.shape[0] == 1``) is probed
    with the example's batch instead (``probes`` None)."""
    readers = {name: m for name, m in result.layers.items() if "in" in m and not bool(m["in"].all())
               and bool(m.get("out", m["in"][:1] | True).any())}  # an emptied layer takes no fold
    summary = {"layers": 0, "folded": 0, "unfolded": 0, "applied": False}
    if not readers:
        return summary
    probe, pick = probe_like(example, probes), picker(output_transform)
    pruned = result.model
    try:  # nothing is changed before both have run
        seen, reference = _reference_inputs(original, result.masks, readers, probe, pick)
        before, following = _batchnorm_after(pruned, readers, probe, pick)
    except Exception:  # noqa: BLE001 (a forward of one batch size: the check ran it at the example's)
        if probes is None:
            raise
        return compensate(original, result, example, None, output_transform)
    undo = []
    for name, masks in readers.items():
        cut = ~masks["in"]
        layer = original.get_submodule(name)
        if getattr(layer, "groups", 1) != 1:  # a grouped convolution: not folded (yet)
            summary["unfolded"] += int(cut.sum())
            continue
        shift, same = _missing(layer, seen[name], cut, result.baked.get(name))
        if not same:  # what this layer read of the cut channels depends on the input
            summary["unfolded"] += int(cut.sum())
            continue
        if "out" in masks:
            shift = shift[masks["out"].to(shift.device)]
        target = pruned.get_submodule(name)
        if target.bias is not None:
            undo.append((target.bias, target.bias.detach().clone()))
            target.bias.add_(shift.to(target.bias))
        elif name in following:
            mean = following[name].running_mean
            undo.append((mean, mean.clone()))
            mean.sub_(shift.to(mean))
        else:
            summary["unfolded"] += int(cut.sum())
            continue
        summary["layers"] += 1
        summary["folded"] += int(cut.sum())
    if not undo:
        return summary
    after = _run(pruned, probe, pick)
    if (after - reference).norm() <= (before - reference).norm():
        summary["applied"] = True
    else:
        for tensor, saved in undo:
            tensor.detach().copy_(saved)
    return summary


def probe_like(example, count: int | None = None) -> tuple:
    """Normal noise in place of each floating input tensor of ``example``, ``count`` images of
    it (default: the example's own batch), the other inputs as they are."""
    gen = torch.Generator().manual_seed(0)
    return tuple(torch.randn(count or len(t), *t.shape[1:], generator=gen).to(t.device, t.dtype)
                 if isinstance(t, torch.Tensor) and t.is_floating_point() else t
                 for t in as_inputs(example))


def _outputs(out) -> torch.Tensor:
    """Every floating tensor of a model's output (a tuple, a dict, a detector's result object),
    flattened into one vector."""
    parts = [t.detach().float().flatten() for t in leaves(out) if t.is_floating_point()]
    return torch.cat(parts) if parts else torch.zeros(0)


def _run(model: nn.Module, x: tuple, pick=None) -> torch.Tensor:
    """``model(*x)``'s outputs (as ``pick`` takes them) in eval mode, every module's mode
    restored after."""
    with modes_kept(model):
        out = model.eval()(*x)
        return _outputs(pick(out) if pick else out)


def _missing(layer: nn.Module, x: torch.Tensor, cut: torch.Tensor,
             weight: torch.Tensor | None = None) -> tuple[torch.Tensor, bool]:
    """What ``layer`` received from its ``cut`` input channels, per output channel, averaged
    over the output positions (the constant closest to it: exact for a linear or 1x1 layer,
    and for a padded kxk one wherever the kernel lies inside the image); and whether the
    other probe images give the same (a constant does not depend on the input). ``weight``:
    what it convolved with, where its forward computed that (``PruneResult.baked``)."""
    cut = cut.to(x.device)
    w = (layer.weight if weight is None else weight).detach()
    xs = x[:, cut] if isinstance(layer, nn.Conv2d) else x[..., cut]
    if len(xs) > 1 and torch.equal(xs, xs[:1].expand_as(xs)):
        xs = xs[:1]  # every probe gave these inputs alike: one image says what all would
    if isinstance(layer, nn.Conv2d):
        part = _constant_conv_mean(layer, xs, w, cut)
        if part is None:
            part = nn.functional.conv2d(xs, w[:, cut], None, layer.stride, layer.padding, layer.dilation)
            part = part.mean((2, 3))
    else:  # a linear layer, on (N, features) or on tokens (N, L, features): the others at zero
        part = xs.new_zeros(*xs.shape[:-1], len(cut))
        part[..., cut] = xs
        part = part @ w.T
        part = part.flatten(1, -2).mean(1) if part.dim() > 2 else part
    part = part.float()
    a = part[0]
    return a, bool(torch.allclose(part, a.expand_as(part), rtol=1e-4, atol=1e-5 * (1 + float(a.abs().max()))))


def _constant_conv_mean(layer: nn.Conv2d, xs: torch.Tensor, w: torch.Tensor,
                        cut: torch.Tensor) -> torch.Tensor | None:
    """``conv2d(xs, w[:, cut])`` averaged over its output positions, without the convolution
    (or a copy of the weight), where each input channel of ``xs`` (the ``cut`` ones) is one
    value over the whole map (a cut channel's constant, the usual case): each tap's weight
    counts by the share of output positions at which it falls inside the image (zero padding:
    outside, it reads 0). None where that does not hold."""
    if layer.padding_mode != "zeros" or isinstance(layer.padding, str) or xs.dim() != 4 \
            or not torch.equal(xs, xs[:, :, :1, :1].expand_as(xs)):
        return None
    shares = []
    for n, k, s, p, d in zip(xs.shape[2:], w.shape[2:], layer.stride, layer.padding, layer.dilation):
        out = (n + 2 * p - d * (k - 1) - 1) // s + 1
        if out < 1:
            return None
        rows = torch.arange(out).unsqueeze(1) * s - p + torch.arange(k).unsqueeze(0) * d  # (out, k)
        shares.append(((rows >= 0) & (rows < n)).to(w.device, w.dtype).mean(0))
    values = xs.new_zeros(len(xs), len(cut))
    values[:, cut] = xs[:, :, 0, 0]  # the kept channels at zero: the full weight, not a copy of its columns
    taps = w.flatten(2) @ (shares[0][:, None] * shares[1][None, :]).flatten()  # (out, in): one read of w
    return values @ taps.T


def _reference_inputs(original: nn.Module, masks: dict, readers, probe,
                      pick=None) -> tuple[dict, torch.Tensor]:
    """What each reader receives from the original with the cut channels' gamma at zero, on
    the probe images, and that network's output (the gammas are restored, whatever happens)."""
    seen, saved = {}, []

    def input_of(name):
        return lambda m, args, out: seen.__setitem__(name, args[0].detach())

    hooks = [(original.get_submodule(name), input_of(name)) for name in readers]
    try:
        for name, keep in masks.items():
            bn = original.get_submodule(name)
            if bn.weight is not None and not bool(keep.all()):
                saved.append((bn, bn.weight.detach().clone()))
                bn.weight.detach()[~keep.to(bn.weight.device)] = 0
        with hooked(post=hooks), kept_statistics(original, masks):
            output = _run(original, probe, pick)
    finally:
        for bn, weight in saved:
            bn.weight.detach().copy_(weight)
    return seen, output


def _batchnorm_after(model: nn.Module, readers, probe: tuple,
                     pick=None) -> tuple[torch.Tensor, dict[str, nn.Module]]:
    """``model``'s outputs on ``probe`` (``_run``), and for each reader the BatchNorm that takes
    its output directly, if one does (found in that same forward by matching tensors)."""
    outputs, found = {}, {}

    def after(name):  # the tensor is kept, so that its id cannot pass to another one
        return lambda m, args, out: outputs.__setitem__(id(out), (name, out))

    def before(bn):
        def hook(m, args):
            name, out = outputs.get(id(args[0]), (None, None))
            if out is args[0]:
                found[name] = bn
        return hook

    with hooked(pre=[(m, before(m)) for m in model.modules() if isinstance(m, _BN)],
                post=[(model.get_submodule(name), after(name)) for name in readers]):
        output = _run(model, probe, pick)
    return output, found


@torch.no_grad()
def recalibrate_bn(model: nn.Module, batches: Iterable, count: int,
                   device: torch.device | str = "cpu") -> int:
    """Re-estimate every BatchNorm's running statistics of ``model`` on the first ``count``
    batches (x, y) of ``batches``: an exact average over them (momentum None), no gradient, no
    weight changed, dropout off. Returns the number of images seen."""
    if count < 1:
        raise SlimmingError(f"count (batches to recalibrate on) must be >= 1, got {count}", param="count")
    bns = [m for m in model.modules() if isinstance(m, _BN) and m.track_running_stats]
    if not bns:
        return 0
    was_training, momenta = model.training, [bn.momentum for bn in bns]
    seen = 0
    try:
        model.eval()
        for bn in bns:
            bn.reset_running_stats()
            bn.momentum = None  # a cumulative average over the batches
            bn.train()
        for i, (x, _) in enumerate(batches):
            if i >= count:
                break
            model(x.to(device, non_blocking=True))
            seen += len(x)
    finally:
        for bn, momentum in zip(bns, momenta):
            bn.momentum = momentum
        model.train(was_training)
    return seen
