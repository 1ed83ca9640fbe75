"""The sparsity term of network slimming: an L1 penalty on the BatchNorm scale factors (gammas).

The penalty ``S * sum(|gamma|)`` is not added to the loss; its subgradient ``S * sign(gamma)``
is added to the gammas' gradients after ``backward()`` and before ``optimizer.step()``. With
mixed precision, call it after ``scaler.unscale_(optimizer)`` so that S does not depend on the
loss scale. In your own training loop::

    sparsity = slimming.BNSparsity(model, strength=1e-4)
    loss.backward()
    sparsity.apply()          # grad += 1e-4 * sign(gamma) for every prunable BN
    optimizer.step()
"""

from __future__ import annotations

import torch
from torch import nn

from .errors import SlimmingError
from .prune import prunable_bns


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


class BNSparsity:
    """Applies the L1 subgradient to the gammas of ``model``'s prunable BatchNorm layers."""

    def __init__(self, model: nn.Module, strength: float):
        if strength < 0:
            raise SlimmingError(f"sparsity strength must be >= 0, got {strength}")
        self.strength = strength
        self.params = [bn.weight for bn in prunable_bns(model) if bn.weight is not None]

    def apply(self) -> None:
        add_l1_subgradient(self.params, self.strength)

    @torch.no_grad()
    def fraction_below(self, bound: float = 1e-2) -> float:
        """Fraction of prunable gammas with |gamma| < bound: how far sparsity training has got."""
        if not self.params:
            return 0.0
        g = torch.cat([p.detach().abs().flatten() for p in self.params])
        return (g < bound).float().mean().item()


class SparsityController:
    """``--sparsity-target F``: steers the L1 strength from epoch to epoch so that, by the end
    of training, a fraction F of the prunable |gamma| sits under ``bound`` (1e-2), instead of a
    strength the user has to guess.

    The L1 term moves a gamma by about lr * strength per step, so sparsity is made while the
    learning rate is high; at a low one, raising the strength moves the gammas little and
    costs accuracy. So the goal after epoch e of E rises linearly to F by half of the run
    (the step schedule's first decay, the cosine's half-way point):
    g_e = F * min(1, (e + 1) / (E / 2)). After each epoch the fraction f_e actually under the
    bound is measured and the strength is multiplied by 2 ** clip(4 (g_e - f_e) / F, -1, 1):
    up to doubled when behind the goal, up to halved when ahead, unchanged on it; but never
    raised once the next epoch's learning rate is under half its peak. It starts from
    ``--sparsity``.
    """

    def __init__(self, target: float, bound: float = 1e-2):
        if not 0 < target < 1:
            raise SlimmingError(f"--sparsity-target must be in (0, 1), got {target:g}")
        self.target, self.bound = target, bound

    def goal(self, epoch: int, epochs: int) -> float:
        return self.target * min(1.0, (epoch + 1) / max(0.5 * epochs, 1.0))

    def update(self, strength: float, epoch: int, epochs: int, fraction: float,
               lr_ratio: float = 1.0) -> float:
        """The strength for the next epoch, after ``epoch`` (0-based) ended at ``fraction``;
        ``lr_ratio``: the next epoch's learning rate over its peak."""
        error = (self.goal(epoch, epochs) - fraction) / self.target
        step = max(-1.0, min(1.0, 4.0 * error))
        if lr_ratio < 0.5:
            step = min(step, 0.0)
        return strength * 2.0 ** step
