"""What a network costs: parameters, FLOPs, size on disk and latency (``stats``); latency as
the device runs it, interleaved, and single layers timed at candidate widths into a lookup
table kept on disk (``latency``); and how well
a detector finds objects, before and after slimming: mAP (``detection``). Any ``nn.Module``;
nothing here builds a network.

Which parts it may import: ``docs/layout.md``.
"""
