"""Latency figures that survive a busy machine: one estimator, its spread, and when to stop.

Other work on the machine only ever adds to a forward's time (the scheduler takes the core
away, a cache is evicted), so a latency is estimated by a low quantile of repeated samples
(``QUANTILE``, the fastest tenth: as ``timeit`` advises the minimum, but steadier across runs).
Two networks are compared in rounds that time each once, in turn, so that a slow spell falls
on both: their ratio is the median of the rounds' ratios, the steadiest of the estimators
tried across repeated runs, quiet and beside CPU-bound loops (``benchmarks/RESULTS.md``,
"Latency on a busy machine": on resnet50, 1 thread, runs of 24 rounds agreed to 0.012 (sd)
where the ratio of low quantiles agreed to 0.022 and of minima to 0.036); the pruned
network's latency is that ratio times the original's, so the three figures printed agree.
Every spread is computed the same way as its figure: the estimate over bootstrap resamples
of the rounds, half the width of their central 95%, so that two measurements of one thing
agree within the spreads they print.

``sample`` takes rounds from a ``LatencyModel`` until the spread is small enough for what the
caller must decide, or a cap is reached (``MAX_SAMPLES``, or the timer's ``max_seconds``); the
caller says what a measurement still too noisy to decide means.
"""

from __future__ import annotations

import math
import os
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ..errors import SlimmingError, clip
from ..utils import progress

QUANTILE = 0.1  # the estimate: the fastest tenth of the samples
RESAMPLES = 200  # bootstrap resamples for a spread (a few ms of Python for 100 samples)
MAX_SAMPLES = 120  # samples per network at most in one measurement
MAX_SECONDS = 60.0  # and seconds at most, unless the timer says otherwise (its ``max_seconds``)


def low_quantile(samples: Sequence[float], q: float = QUANTILE) -> float:
    """The ``q`` quantile of ``samples`` (linear between order statistics)."""
    s = sorted(samples)
    i = q * (len(s) - 1)
    lo = int(i)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (i - lo)


@dataclass(frozen=True)
class Estimate:
    """A latency (ms) or a ratio of latencies, ``value``, with ``spread``: half the width of
    the central 95% of the same estimate over bootstrap resamples of the ``samples`` rounds."""

    value: float
    spread: float
    samples: int

    @property
    def relative(self) -> float:
        """The spread as a fraction of the value."""
        return self.spread / self.value if self.value > 0 else float("inf")

    def __str__(self) -> str:
        return f"{self.value:.3g} +- {self.spread:.2g}"


def _spread(values: list[float]) -> float:
    values.sort()
    return (values[int(0.975 * (len(values) - 1))] - values[int(0.025 * (len(values) - 1))]) / 2


def estimate(samples: Sequence[float]) -> Estimate:
    """The low quantile of ``samples`` (ms) and its bootstrap spread."""
    samples = list(samples)
    rng, n = random.Random(0), len(samples)
    boot = [low_quantile([samples[rng.randrange(n)] for _ in range(n)]) for _ in range(RESAMPLES)]
    return Estimate(low_quantile(samples), _spread(boot) if n > 1 else 0.0, n)


def ratio(base: Sequence[float], other: Sequence[float]) -> Estimate:
    """``other``'s latency over ``base``'s, from samples taken in turn (round i of each is a
    pair): the median of the rounds' ratios, and its spread over resamples of the rounds."""
    pairs = [b / max(a, 1e-12) for a, b in zip(base, other)]
    rng, n = random.Random(0), len(pairs)
    boot = [statistics.median([pairs[rng.randrange(n)] for _ in range(n)]) for _ in range(RESAMPLES)]
    return Estimate(statistics.median(pairs), _spread(boot) if n > 1 else 0.0, n)


def scaled(r: Estimate, base: Estimate) -> Estimate:
    """``r`` (a ratio) times ``base`` (a latency): the latency of the network ``r`` compares
    with ``base``'s, its spread from both (relative spreads added in quadrature)."""
    value = r.value * base.value
    spread = value * math.hypot(r.relative if r.value else 0.0, base.relative if base.value else 0.0)
    return Estimate(value, spread, r.samples)


def sample(cost, models: Sequence, inputs: tuple, enough: Callable[[list[list[float]]], bool],
           max_samples: int = MAX_SAMPLES, desc: str = "latency") -> tuple[list[list[float]], bool]:
    """Samples (ms) of each of ``models``, interleaved, from ``cost.network``: one call, then
    more while ``enough(samples)`` is false, at most ``max_samples`` per model and the timer's
    ``max_seconds`` (``MAX_SECONDS`` for one that does not say), counted on a progress bar
    (``desc``; a terminal only). Returns the samples and whether they were enough."""
    cap = getattr(cost, "max_seconds", MAX_SECONDS)
    start = time.perf_counter()
    with progress.bar(desc=desc, unit="round", show=hasattr(cost, "max_seconds")) as bar:
        out = _samples(cost, models, inputs)
        bar.update(len(out[0]))
        while not enough(out):
            if len(out[0]) >= max_samples or time.perf_counter() - start > cap:
                return out, False
            out = [a + b for a, b in zip(out, _samples(cost, models, inputs))]
            bar.update(len(out[0]) - bar.n)
    return out, True


def _samples(cost, models: Sequence, inputs: tuple) -> list[list[float]]:
    """One call of ``cost.network``, checked: a list of samples (finite milliseconds >= 0, at
    least one) per model; SlimmingError naming ``latency_model`` for anything else."""
    got = cost.network(models, inputs)
    try:
        out = [[float(v) for v in s] for s in got]
    except (TypeError, ValueError, OverflowError):
        out = None
    fine = out is not None and len(out) == len(models)
    if not fine or not all(s and all(0 <= v < math.inf for v in s) for s in out):
        raise SlimmingError(f"latency_model {type(cost).__name__}'s network() gave {clip(repr(got), 80)} for "
                            f"{len(models)} network(s): it gives a list of timings (milliseconds, at least "
                            "one) per network", param="latency_model")
    return out


def machine_load() -> str:
    """This machine's load, in words (for a message about noise): the 1-minute load average
    against the cores, and torch's threads."""
    cores = os.cpu_count() or 1
    try:
        load = f"load average {os.getloadavg()[0]:.1f} on {cores} cores, "
    except OSError:  # not on every platform
        load = f"{cores} cores, "
    return f"{load}{torch.get_num_threads()} torch thread(s)"
