"""What slimming knows about layers, for cutting them: below both ``slimming.pruning`` and
``slimming.io``, above nothing but ``utils``. The network families themselves are
``slimming.models`` (the top-level ``models/`` folder), which knows nothing of pruning.

- ``rules``: one rule per layer kind (what its tensors follow, its widths, whether its scale
  scores channels), ``register_layer``, ``ChannelGate`` and ``HeadGate``;
- ``gates``: gates put where a width has no scaling factor, or per head: attach, fold;
- ``baked``: a layer whose forward computes its weight (weight standardisation), made the plain
  layer it ran where the cut touches it, and the list saved files keep;
- ``removed``: ``Emptied`` and ``Constant``, what the layers of a residual branch cut whole
  still compute (nothing, a constant), and the list saved files keep;
- ``attention``: torch's ``MultiheadAttention`` in steps the trace follows, widths of its own;
- ``resize``: a freshly built network given the widths of a pruned state_dict (how a pruned
  torchvision, timm or user network rebuilds itself).

Which parts it may import: ``docs/layout.md``.
"""
