"""Files: the checkpoint format, its fields and how a checkpoint rebuilds its network
(``checkpoint``), a pruned network of the user's own class without its code (``pruned``:
``save_pruned``/``load_pruned``), and the network-slimming paper's own checkpoint files
(``paper``, with what a state_dict's shapes say in ``structure``). Bounded, checksummed loading
is ``slimming.utils.safeload``.

Which parts it may import: ``docs/layout.md``.
"""
