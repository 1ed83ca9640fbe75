"""The sparsity term of network slimming: an L1 penalty on the scaling factors (the gammas of
the BatchNorms and GroupNorms, ``slimming.prunable_factors``).

The penalty ``S * sum(|gamma|)`` is not added to the loss; its subgradient ``S * sign(gamma)``
is added to the gammas' gradients after ``backward()`` and before ``optimizer.step()``. With
mixed precision, call it after ``scaler.unscale_(optimizer)`` so that S does not depend on the
loss scale. In your own training loop::

    sparsity = slimming.Sparsity(model, strength=1e-4)
    loss.backward()
    sparsity.apply()          # grad += 1e-4 * sign(gamma) for every scaling factor
    optimizer.step()
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..errors import SlimmingError, number
from ..pruning.graph import ignored_names
from ..pruning.select import SPARSE_BOUND, prunable_factors


def add_l1_subgradient(params: list[torch.Tensor], strength: float) -> None:
    """``p.grad += strength * sign(p)`` for every p in ``params`` that has a gradient.

    One fused ``torch._foreach_*`` call for the whole list instead of one kernel per layer.
    """
    with_grad = [p for p in params if p.grad is not None]
    if strength == 0 or not with_grad:
        return
    with torch.no_grad():
        signs = torch._foreach_sign([p.detach() for p in with_grad])
        torch._foreach_add_([p.grad for p in with_grad], signs, alpha=strength)


class Sparsity:
    """Applies the L1 subgradient to ``model``'s scaling factors (``prunable_factors``: the
    gammas of its BatchNorms and GroupNorms, or a family's prunable BatchNorms), but those
    inside ``ignore`` (module names or types, as ``slimming.prune`` takes them: the detection
    head you will keep whole need not be made sparse)."""

    def __init__(self, model: nn.Module, strength: float, ignore=()):
        number(strength, "strength", low=0)  # nan, inf and True would poison every step
        self.strength = strength
        kept = ignored_names(model, ignore)  # as prune reads ignore= (0 and '' refused there too)
        skip = {id(m) for name, m in model.named_modules() if name in kept}
        self.params = [m.weight for m in prunable_factors(model) if isinstance(m.weight, nn.Parameter)
                       and id(m) not in skip]  # a frozen BatchNorm's buffer is not trained

    def apply(self) -> None:
        add_l1_subgradient(self.params, self.strength)

    @torch.no_grad()
    def fraction_below(self, bound: float = SPARSE_BOUND) -> float:
        """Fraction of prunable gammas with |gamma| < bound: how far sparsity training has got."""
        if not self.params:
            return 0.0
        g = torch.cat([p.detach().abs().flatten() for p in self.params])
        return (g < bound).float().mean().item()


BNSparsity = Sparsity  # the name it had while BatchNorms were the only factors


class SparsityController:
    """``--sparsity-target F``: steers the L1 strength during training so that a fraction F of
    the prunable |gamma| sits under ``bound`` (1e-2), instead of a strength the user has to guess.

    The L1 term moves a gamma by about lr * strength per step, so sparsity is made while the
    learning rate is high; at a low one, a stronger pull moves the gammas little and costs
    accuracy. So the controller aims to have F under the bound by ``reach`` (40%) of the run,
    before the step schedule's first decay, and never raises the strength once the learning
    rate is under half the highest it has been.

    It steers within the epoch, ``checks`` (10) times an epoch, on a signal that moves
    continuously: q, the F-quantile of |gamma| (F of the gammas are at or under q, so the goal
    is q < bound). The fraction under the bound itself is a poor signal: it stays at 0 while
    the gammas descend and then jumps as they cross in bulk. At each check:

    - q above the bound: the rate q must fall at to reach the bound in the steps left before
      ``reach`` (at least two checks' worth) is compared with the rate it fell at since the
      last check, and the strength is scaled by their ratio, clipped to [1/2, 4]: a strength
      30x or 1000x too low is found in a few checks, not a few epochs, and one too high is
      lowered before it has pulled every gamma to zero. Since both rates are measured, not
      modelled, the loss's pull against the L1 term is accounted for. Past ``reach`` and still
      short of the target, it is not lowered here (the rule near F may). A q that rose since
      the last check (the loss pushing back at a strength just lowered) doubles the strength;
      x4 there made the strength swing between x4 and x1/2 around the right one.
    - q under the bound: held while the fraction under it is at most F + ``tolerance`` (0.02);
      above, scaled by 2^-clip(8 e / F, 0, 1) for an excess e over F + tolerance: halved when
      far over, lowered a little when just over, since a pull lowered too far lets the gammas
      it holds at zero drift back over the bound once the strength may no longer rise.
    - Near the target (a fifth of F or more under the bound), also never more than
      2^clip(g (F - f') / F, -1, 1), where f' is the fraction the trend since the last check
      heads for by the next one, g = 2 under F and 8 over it; held only while f' is in
      [F - tolerance, F] and the fraction within ``tolerance`` of F. The gammas cross in bulk
      and fast there (36% -> 52% -> 65% in two checks of a 6-epoch run, with the strength held
      because 52% was in the band), and a channel whose gamma reached zero stays there however
      weak the pull becomes (a 12-epoch run crept from 50% to 56% in five checks while its
      strength was lowered by x0.9 a check). So the strength rises by x2 at most while far
      under, a little when close, and falls fast as soon as the fraction heads over F: an
      undershoot is made up by the next raise, an overshoot never.
    - Never raised past bound / (2 lr), a pull of half the bound a step (SGD): a gamma the L1
      term holds at zero then stays under the bound, and a target the network cannot reach
      without its useful channels does not make the strength run away.

    The strength starts from ``--sparsity``. The first check of each epoch compares with q and
    the fraction at the epoch's start, so a run resumed at an epoch boundary steers exactly as
    one that was not stopped (given the saved strength and peak learning rate).
    """

    def __init__(self, target: float, bound: float = SPARSE_BOUND, reach: float = 0.4, checks: int = 10,
                 tolerance: float = 0.02):
        if not 0 < target < 1:
            raise SlimmingError(f"sparsity target must be in (0, 1), got {target:g}")
        self.target, self.bound, self.reach = target, bound, reach
        self.checks, self.tolerance = checks, tolerance
        self.peak_lr = 0.0  # the highest learning rate seen: saved with the strength for --resume

    @torch.no_grad()
    def measure(self, sparsity: BNSparsity) -> tuple[float, float]:
        """(q, fraction): the F-quantile of the prunable |gamma| and the fraction under the bound."""
        if not sparsity.params:
            return 0.0, 1.0
        g = torch.cat([p.detach().abs().flatten().float() for p in sparsity.params])
        k = min(len(g), max(1, math.ceil(self.target * len(g))))
        q, fraction = torch.stack([g.kthvalue(k).values, (g < self.bound).float().mean()]).tolist()
        return q, fraction

    def start_epoch(self, sparsity: BNSparsity, epoch: int, epochs: int, steps: int, lr: float) -> None:
        """Before epoch ``epoch`` (0-based) of ``epochs``, of ``steps`` steps at learning rate ``lr``."""
        self.peak_lr = max(self.peak_lr, lr)
        self.high_lr = lr >= 0.5 * self.peak_lr
        # never raised past a pull of bound / 2 a step, under which a gamma held at zero by
        # the L1 term stays under the bound (a target out of reach must not run away)
        self.ceiling = self.bound / (2 * lr) if lr > 0 else math.inf
        self.interval = max(1, steps // self.checks)
        self.goal_step = self.reach * epochs * steps
        self.epoch_start = epoch * steps
        (self.last_q, self.last_fraction), self.last_step = self.measure(sparsity), 0

    def due(self, step: int) -> bool:
        """Whether a check comes after ``step`` (1-based) steps of this epoch."""
        return step % self.interval == 0

    def update(self, sparsity: BNSparsity, step: int) -> float:
        """The strength from here on, after ``step`` (1-based) steps of this epoch."""
        q, fraction = self.measure(sparsity)
        if q < self.bound:  # on or over the target: lowered in proportion to the excess, so
            # that a fraction just over the band is not paid for with a pull so weak that the
            # gammas it holds at zero drift back over the bound once raising is no longer allowed
            excess = (fraction - self.target - self.tolerance) / self.target
            factor = 2.0 ** -max(0.0, min(1.0, 8.0 * excess))
        else:
            left = max(self.goal_step - (self.epoch_start + step), 2 * self.interval)
            need = (q - self.bound) / left
            seen = (self.last_q - q) / max(step - self.last_step, 1)
            factor = 2.0 if seen <= 0 else min(4.0, max(0.5, need / seen))
            if self.epoch_start + step >= self.goal_step:  # late and short: not lowered (but near F)
                factor = max(factor, 1.0)
        if fraction >= 0.2 * self.target:  # near: never more than the trend to the target allows
            since = max(step - self.last_step, 1)
            heading = fraction + (fraction - self.last_fraction) * self.interval / since
            gain = 2.0 if heading < self.target else 8.0  # an overshoot stays: lowered fast
            there = abs(fraction - self.target) <= self.tolerance
            if there and self.target - self.tolerance <= heading <= self.target:
                factor = min(factor, 1.0)  # there, and staying: held (not raised by a q that rose)
            else:
                factor = min(factor, 2.0 ** max(-1.0, min(1.0, gain * (self.target - heading) / self.target)))
        if not self.high_lr:
            factor = min(factor, 1.0)
        self.last_q, self.last_fraction, self.last_step = q, fraction, step
        if factor <= 1:
            return sparsity.strength * factor
        return max(sparsity.strength, min(sparsity.strength * factor, self.ceiling))
