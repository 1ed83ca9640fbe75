"""The command line: reading the arguments (``parser``, which imports no torch, so that
``--help`` and a typo answer at once), then checking them against each other and running the
command (``run``), what each subcommand does (``commands``) and ``slimming pipeline``
(``pipeline``). Where a run's files go, the device and reading a checkpoint back are
``slimming.training.runs``.

Which parts it may import: ``docs/layout.md``.
"""

from __future__ import annotations

from .parser import Parser, build_parser, read_args


def main(argv: list[str] | None = None) -> int:
    """``slimming ...``: the exit code of the command ``argv`` (``sys.argv[1:]``) names."""
    args = read_args(argv)
    from .run import run  # torch and the commands, once the arguments are read

    return run(args)


__all__ = ["Parser", "build_parser", "main", "read_args"]
