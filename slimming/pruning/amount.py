"""How much a prune cuts, read once where the value enters (``prune()``, the command line) and
passed down as one typed record, ``Amount``: which way it was said (``kind``, the parameter's
name), the number and its unit. Torch-free, so that the command line reads a budget the way
the library does before torch is imported.

- ``percent``: a share of the ranked channels, in [0, 1) (unit ``"share"``);
- ``threshold``: every channel scoring at or under it, >= 0 (unit ``"score"``);
- ``target_flops`` / ``target_params``: a fraction in (0, 1) of the unpruned network's count
  (unit ``"fraction"``) or a count (``2.5e8``, unit ``"count"``); whether it is under the
  network's count is ``budget.parse_budget``'s, which counts it;
- ``target_latency``: a fraction in (0, 1) of the original's measured latency (``"fraction"``)
  or milliseconds (``"ms"``: ``"12ms"``, ``"0.012s"``, a number >= 1), as
  ``slimming.errors.parse_latency`` reads it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import SlimmingError, as_fraction_hint, number, parse_latency

KINDS = ("percent", "threshold", "target_flops", "target_params", "target_latency")


@dataclass(frozen=True)
class Amount:
    """How much to cut: ``kind`` (one of ``KINDS``), ``value`` and its ``unit``; ``given``: the
    value as the user wrote it, for messages (``"12ms"``)."""

    kind: str
    value: float
    unit: str
    given: object = None

    @classmethod
    def of(cls, percent=None, threshold=None, target_flops=None, target_params=None,
           target_latency=None) -> Amount:
        """The one amount given, checked; SlimmingError naming the parameter for none, two, or
        a value that is no amount of its kind."""
        values = (percent, threshold, target_flops, target_params, target_latency)
        given = {k: v for k, v in zip(KINDS, values) if v is not None}
        if len(given) != 1:
            raise SlimmingError("give exactly one of percent, threshold, target_flops, target_params and "
                                "target_latency", param=KINDS)
        (kind, value), = given.items()
        if kind == "target_latency":
            unit, amount = parse_latency(value)
            return cls(kind, amount, unit, value)
        number(value, kind)  # a number at all ("0.5", True, nan are not): the ranges below
        if kind == "percent":
            if not 0 <= value < 1:
                raise SlimmingError(f"percent must be in [0, 1), got {value}{as_fraction_hint(value)}",
                                    param="percent")
            return cls(kind, float(value), "share", value)
        if kind == "threshold":
            if not 0 <= value < math.inf:
                raise SlimmingError(f"threshold must be >= 0 and finite, got {value}", param="threshold")
            return cls(kind, float(value), "score", value)
        if value <= 0:
            raise SlimmingError(f"{kind} must be a fraction in (0, 1) or a count, got {value:g}", param=kind)
        return cls(kind, float(value), "fraction" if value < 1 else "count", value)

    @property
    def what(self) -> str | None:
        """``"flops"`` or ``"params"`` for a count budget, else None."""
        return {"target_flops": "flops", "target_params": "params"}.get(self.kind)
