"""What users do with a checkpoint besides training it: pruning-ratio sweeps (``sweep``),
export to TorchScript / ONNX (``export``), the report (``report``) and its plots (``plots``).

Imports: ``slimming.training``, ``slimming.data``, ``slimming.io``, ``slimming.pruning``,
``slimming.measure``, ``slimming.models``, ``slimming.utils``, ``slimming.errors``.
"""
