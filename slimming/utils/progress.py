"""Progress on every step that can take more than a few seconds: tqdm bars on stderr, shown
only where stderr is a terminal (tqdm's own rule: a log or a pipe gets none), never while
``quiet()`` holds (the command line's ``--quiet``) or where ``TQDM_DISABLE`` is set (tqdm's own
switch, which a bar given ``disable=`` would not read).

``bar(...)``: one tqdm bar (``leave=False``: it is gone when its step ends). ``steps(desc)``:
one bar counting the named parts of a long call (``prune``: trace, cut, budget candidates,
check, ...); ``at(part)`` inside it (anywhere down the stack, a nested ``steps`` counting
for itself) says which part is running and counts it. Outside any ``steps``, ``at`` does
nothing, so code that reports its parts runs the same without a bar."""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterable, Iterator

from tqdm import tqdm

_QUIET = contextvars.ContextVar("slimming_quiet", default=False)
_STEPS: contextvars.ContextVar[tqdm | None] = contextvars.ContextVar("slimming_steps", default=None)


def is_quiet() -> bool:
    """Whether bars are off here: inside ``quiet()``, or ``TQDM_DISABLE`` set to a true value."""
    return _QUIET.get() or os.environ.get("TQDM_DISABLE", "").strip().lower() in ("1", "true", "yes", "on")


@contextlib.contextmanager
def quiet(on: bool = True) -> Iterator[None]:
    """No progress bars (and no plain progress lines in a log) while it holds, with ``on``."""
    token = _QUIET.set(_QUIET.get() or on)
    try:
        yield
    finally:
        _QUIET.reset(token)


def bar(iterable: Iterable | None = None, *, desc: str, unit: str = "it", total: float | None = None,
        show: bool = True) -> tqdm:
    """A tqdm bar over ``iterable`` (or updated by hand); off where ``show`` is false, under
    ``quiet()``, and where stderr is not a terminal."""
    return tqdm(iterable, desc=desc, unit=unit, total=total, leave=False, dynamic_ncols=True,
                disable=True if (is_quiet() or not show) else None)


@contextlib.contextmanager
def steps(desc: str) -> Iterator[tqdm]:
    """A bar counting the parts of one long call that ``at`` names (see the module docstring)."""
    with bar(desc=desc, unit="step") as b:
        token = _STEPS.set(b)
        try:
            yield b
        finally:
            _STEPS.reset(token)


def at(part: str) -> None:
    """The innermost ``steps`` bar counts one more part and says it is at ``part``."""
    b = _STEPS.get()
    if b is not None and not b.disable:
        b.update(1)
        b.set_postfix_str(part)  # drawn now: a part is seconds long, never too many to draw
