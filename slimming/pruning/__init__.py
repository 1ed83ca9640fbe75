"""Pruning: which channels go together (``graph``: the channel graph, built by ``trace`` from one
real forward that ``capture`` runs and tells to its listeners: the channel walk in ``trace``,
what the inputs became and where parameters went in ``flow``; ``trace`` gives a ``traced``
record, the graph and the widths, baked weights and coverage beside it; ``register``: the ops
it knows, and ``register_layer`` and ``register_op``, which teach it yours; the handlers of what
each torch op does to channels are in ``ops``, ``reshape`` (views, permutations, attention
heads) and ``index``, and of layers, by the rules of ``slimming.layers.rules``, in
``layer_calls``), which to cut (``amount``: how much, read once where it enters;
``importance``: the criteria; ``select``: one global threshold; ``budget``: a FLOPs or
parameter target; ``speed``: a latency target measured on the device, ranked by ``estimate``,
a network's latency from a lookup table of its layers, which also finds the widths at the top
of a latency step; ``plans``: the groups scored, and how to build a cut of them), and how to
cut them (``surgery`` along the graph, or a family's own walk; ``widths``: which integer widths
the cut set stay, as the check vouches; ``branches``: which residual branches may be cut
whole, and the layers they leave replaced), then folding what the cut channels still gave into
the next layers (``repair``) and checking the pruned network against the original with the cut
channels zeroed (``verify``; what that means for a LayerNorm that loses channels: ``norms``).
``prune`` composes them into ``slimming.prune``, which gives a ``PruneResult`` (``records``:
it, and what a budget asked and achieved) and the warnings a cut deserves (``notes``), and
sets a Hugging Face model's config to the widths it can say (``configs``);
``gates`` (``slimming.add_gates``) finds the widths nothing scores.

Which parts it may import: ``docs/layout.md``.
"""
