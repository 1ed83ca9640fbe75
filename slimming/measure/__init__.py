"""What a network costs: parameters, FLOPs, size on disk and latency (``stats``); latency as
the device runs it, interleaved, and single layers timed at candidate widths into a lookup
table kept on disk (``latency``), each figure a low quantile or a paired median with its spread,
taken until precise (``timing``), in eager, torch.export or onnxruntime (``runtimes``); and how well
a detector finds objects, before and after slimming: mAP (``detection``). Any ``nn.Module``;
nothing here builds a network.

Which parts it may import: ``docs/layout.md``.
"""
