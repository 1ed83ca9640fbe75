"""Files: the checkpoint format, its fields and how a checkpoint rebuilds its network
(``checkpoint``), bounded and checksummed ``torch.load`` (``safeload``), and the network-slimming
paper's own checkpoint files (``paper``, with what a state_dict's shapes say in ``structure``).

Imports: ``slimming.models``, ``slimming.utils``, ``slimming.errors``.
"""
