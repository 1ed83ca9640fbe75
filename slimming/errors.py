"""The user's mistakes, as one exception family.

``SlimmingError`` is what bad input raises anywhere in the toolkit: a flag out of range, a file
that is not a usable checkpoint, a data folder that cannot be read. Its message is one line that
names the file or flag and says what to do. ``slimming.cli.main`` catches it (and only it) once,
prints that line and exits with code 2; anything else that escapes is a bug and keeps its
traceback. It subclasses ValueError, so Python callers that catch ValueError keep working.
"""

from __future__ import annotations


class SlimmingError(ValueError):
    """A mistake in the user's input; the message is one line meant for the user."""


class CheckpointError(SlimmingError):
    """A file that is not a usable checkpoint (missing, corrupt, hostile, inconsistent)."""


class DataError(SlimmingError):
    """A dataset that cannot be read as asked."""


class ExportError(SlimmingError):
    """An export that failed or does not reproduce the model."""


class TrainingError(RuntimeError):
    """The run cannot go on (for example a non-finite loss); exit code 1, not a usage error."""


def first_line(e: BaseException, limit: int = 200) -> str:
    """The first line of an exception's message (its type name if it has none), at most
    ``limit`` characters: what a one-line error may quote of a library's message."""
    text = str(e).strip().splitlines()
    return text[0][:limit] if text else type(e).__name__


def is_out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` is an allocation that failed: a MemoryError, the CPU allocator's "can't
    allocate memory" (a RuntimeError), CUDA's OutOfMemoryError ("out of memory")."""
    text = str(e)
    return isinstance(e, MemoryError) or "can't allocate memory" in text or "out of memory" in text


def clip(value, limit: int = 80) -> str:
    """A value read from a file, for a one-line message: a printable string as it is, anything
    else (a newline, a terminal escape, a non-string) as ``ascii()`` writes it, and cut to about
    ``limit`` characters, so that a 1 MB name or a forged escape sequence stays one short line."""
    text = value if isinstance(value, str) and value.isprintable() else ascii(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"
