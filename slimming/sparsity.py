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
