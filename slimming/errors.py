"""The user's mistakes, as one exception family.

``SlimmingError`` is what bad input raises anywhere in the toolkit: an argument out of range, a
file that is not a usable checkpoint, a data folder that cannot be read. Its message is one line
that names the file or the Python parameter (``target_flops``) and says what to do; ``params``
lists the parameters it names, so that the command line can write its flags in their place
(``--target-flops``, ``slimming.cli.parser.FLAGS``) without the library knowing any flag.
``slimming.cli.parser.main`` turns it into that one line and exit code 2 (as it does an
out-of-memory error and ``TrainingError``, exit code 1); anything else that escapes is a bug and
keeps its traceback. It subclasses ValueError, so Python callers that catch ValueError keep
working.
"""

from __future__ import annotations

import math
import numbers
import re


class NamesParameters(Exception):
    """An error whose one-line message names Python parameters: ``param`` (one name or several)
    are kept as ``params`` for the command line to write its flags in their place."""

    def __init__(self, message: str = "", *, param: str | tuple[str, ...] = ()):
        super().__init__(message)
        self.params = (param,) if isinstance(param, str) else tuple(param)


class SlimmingError(NamesParameters, ValueError):
    """A mistake in the user's input; the message is one line meant for the user."""


class CheckpointError(SlimmingError):
    """A file that is not a usable checkpoint (missing, corrupt, hostile, inconsistent)."""


class DataError(SlimmingError):
    """A dataset that cannot be read as asked."""


class BudgetError(SlimmingError):
    """A FLOPs, parameter or latency budget that no cut reaches: the smallest network the limits
    (min_channels, max_layer_prune, round_to) allow is above it (a sweep records it as missed)."""


class ExportError(SlimmingError):
    """An export that failed or does not reproduce the model."""


class TrainingError(NamesParameters, RuntimeError):
    """The run cannot go on (for example a non-finite loss); exit code 1, not a usage error."""


def first_line(e: BaseException, limit: int = 200) -> str:
    """The first line of an exception's message (its type name if it has none), at most
    ``limit`` characters: what a one-line error may quote of a library's message."""
    text = str(e).strip().splitlines()
    return text[0][:limit] if text else type(e).__name__


def load_error(e: BaseException, limit: int = 200) -> str:
    """What a failed ``load_state_dict`` says in one line: the first line past its "Error(s) in
    loading state_dict" heading (a missing key, a shape), else the message's first line."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return (lines[1] if len(lines) > 1 and "Error(s) in loading" in lines[0] else first_line(e))[:limit]


def is_out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` is an allocation that failed: a MemoryError, the CPU allocator's "can't
    allocate memory" (a RuntimeError), CUDA's OutOfMemoryError ("out of memory")."""
    text = str(e)
    return isinstance(e, MemoryError) or "can't allocate memory" in text or "out of memory" in text


def listed(names: list[str], most: int = 3) -> str:
    """The first ``most`` names, then how many more: "a, b, c and 9 more"."""
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def clip(value, limit: int = 80) -> str:
    """A value read from a file, for a one-line message: a printable string as it is, anything
    else (a newline, a terminal escape, a non-string) as ``ascii()`` writes it, and cut to about
    ``limit`` characters, so that a 1 MB name or a forged escape sequence stays one short line."""
    text = value if isinstance(value, str) and value.isprintable() else ascii(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def number(value, param: str, *, integer: bool = False, low: float | None = None,
           low_ok: bool = True, high: float | None = None, high_ok: bool = False):
    """``value`` if it is a finite real number (an int where ``integer``) in the range given;
    else a SlimmingError naming ``param``. A bool, a string ("0.5"), NaN and inf are refused."""
    kind = numbers.Integral if integer else numbers.Real
    try:
        ok = isinstance(value, kind) and not isinstance(value, bool) and math.isfinite(value)
    except OverflowError:  # an integer too large for a float (10**400)
        ok = False
    ok = ok and (low is None or value > low or (low_ok and value == low))
    ok = ok and (high is None or value < high or (high_ok and value == high))
    if not ok:
        where = (f" in {'[' if low_ok else '('}{low:g}, {high:g}{']' if high_ok else ')'}"
                 if low is not None and high is not None
                 else f" {'>=' if low_ok else '>'} {low:g}" if low is not None else "")
        raise SlimmingError(f"{param} must be {'an integer' if integer else 'a number'}{where}, "
                            f"got {clip(repr(value))}", param=param)
    return value


_TIME = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*(ms|s)?\s*$", re.IGNORECASE)


def as_fraction_hint(value) -> str:
    """"; did you mean 0.7?" for a share written as a percentage (over 1, under 100) where a fraction in
    [0, 1) is asked; "" for anything else."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return ""
    return f"; did you mean {value / 100:g}?" if 1 < value < 100 else ""


def parse_latency(value) -> tuple[str, float]:
    """A latency budget as ("fraction", f) for a number in (0, 1) (of the original's measured
    latency) or ("ms", v) for milliseconds: a number >= 1 or a string with its unit ("12ms",
    "0.012s", "12"). Here, not in ``slimming.pruning.speed``, so that the command line reads a
    budget the way the library does without importing torch."""
    if isinstance(value, str):
        found = _TIME.match(value)
        if not found:
            raise SlimmingError(f"target_latency takes a fraction such as 0.5 or a time such as 12ms, "
                                f"not {clip(repr(value))}", param="target_latency")
        amount, unit = float(found[1]), (found[2] or "").lower()
        if unit:
            value = amount * (1000 if unit == "s" else 1)
            if not 0 < value < math.inf:
                raise SlimmingError(f"target_latency must be a positive time, got {found[0]!r}",
                                    param="target_latency")
            return "ms", value
        value = amount
    number(value, "target_latency")
    if not (0 < value < math.inf):
        raise SlimmingError(f"target_latency must be a fraction in (0, 1) or milliseconds, got {value:g}",
                            param="target_latency")
    return ("fraction", float(value)) if value < 1 else ("ms", float(value))
