"""Pruning: which channels go together (``graph``: the traced channel graph), which to cut
(``importance``: the criteria; ``select``: one global threshold; ``budget``: a FLOPs or
parameter target), and how to cut them (``surgery`` along the graph, or a family's own walk),
then folding what the cut channels still gave into the next layers (``repair``). ``prune``
composes them into ``slimming.prune``.

Imports: ``slimming.models``, ``slimming.measure``, ``slimming.utils``, ``slimming.errors``.
"""
