"""The command line: the parser and the one place a mistake becomes one line and exit code 2
(``parser``), what each subcommand does (``commands``), ``slimming pipeline`` (``pipeline``)
and what the commands share (``runs``: device, outputs, reading a checkpoint back).

Imports: anything in slimming; nothing imports it.
"""

from .parser import Parser, build_parser, main

__all__ = ["Parser", "build_parser", "main"]
