"""What a network costs: parameters, FLOPs, size on disk and latency (``stats``). Any
``nn.Module``; nothing here builds a network.

Imports: ``slimming.utils`` and ``slimming.errors``.
"""
