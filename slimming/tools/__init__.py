"""What users do with a checkpoint besides training it: pruning a checkpoint file
(``prune_checkpoint``), pruning-ratio sweeps (``sweep``), export to torch.export / TorchScript /
ONNX (``export``), the report (``report``) and its plots (``plots``).

Which parts it may import: ``docs/layout.md``.
"""
