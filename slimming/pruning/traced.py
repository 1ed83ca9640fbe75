"""``Traced``: what one trace of a network found, as ``trace`` returns it: the channel algebra
(``graph``, a ``ChannelGraph``) and the records beside it, each written by the trace and read
by the part named for it, never mixed into the graph:

- ``Widths``: where the forward reads channel counts as sizes (a split by an attribute, heads
  merged, a grouped call's groups, the maps around each module): what ``surgery.update_widths``
  reads to set the pruned network's integer attributes.
- ``Baked``: weights a layer's forward computes from its parameters (a standardised weight),
  baked into the plain layer at the cut (``slimming.layers.baked``), and the layers that do more
  than convolve with one (nothing of them is cut; a gate cannot fold there).
- ``Coverage``: which layers the forward did not run, ran only through their tensors, and where
  it read values of its input into Python (its path may depend on them: ``prune``'s check
  tries a second kind of input there).
- ``conditioning``: the layers projecting what an input without channels became (a timestep's
  embedding): their rows are zero where the cut zeroes the channels they meet, in the reference
  too (``PruneResult.masks``), so an AdaGN's or FiLM's scale and shift go with their channel.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass

import torch

from .graph import ChannelGraph, Map, copied


@dataclass
class Widths:
    """Where channel counts are sizes the pruned forward reads (``surgery.update_widths``)."""

    # modules whose blocks (heads) or splits by sizes were followed
    sized: list[str] = field(default_factory=list)
    # (module, size): a width its own forward split or blocked its channels by, followed; an
    # integer attribute of that value is what the forward splits by, so it must follow the cut
    split_sizes: list[tuple[str, int]] = field(default_factory=list)
    frames: dict[str, list[Map]] = field(default_factory=dict)  # module -> the maps its forward's ops made
    borders: dict[str, list[Map]] = field(default_factory=dict)  # module -> the maps of its inputs, outputs
    sides: dict[tuple[str, str], list[Map]] = field(default_factory=dict)  # (module, "in"/"out") -> those
    # module -> (groups, the channels it convolved depthwise) for F.conv2d calls in its forward
    group_counts: dict[str, list[tuple[int, Map]]] = field(default_factory=dict)
    merges: dict[str, list[Map]] = field(default_factory=dict)  # module -> heads merged (N, L, heads * D)
    # (module, attribute) -> what a view sized by that attribute itself merged (TinyViT's
    # ``reshape(B, N, self.out_dim)``): its width, whatever the attribute's name says
    held: dict[tuple[str, str], list[Map]] = field(default_factory=dict)
    # layers run on what carries no channels (Swin-v2's position-bias MLP)
    headless: list[str] = field(default_factory=list)


@dataclass
class Baked:
    """Weights computed by a layer's forward, baked at the cut (``slimming.layers.baked``)."""

    computed: dict[str, torch.Tensor] = field(default_factory=dict)  # layer -> the weight it computed
    unbaked: list[str] = field(default_factory=list)  # layers computing their weight that do more


@dataclass
class Coverage:
    """What of the network the forward ran, and where its path may depend on values."""

    unseen: list[str] = field(default_factory=list)  # layers the forward never ran
    by_weight: list[str] = field(default_factory=list)  # run through their tensors, never their forward
    value_reads: list[str] = field(default_factory=list)  # modules whose forward read values of the inputs
    # (module, attribute, value): integer attributes the forward compared as numbers (flow.compared_widths)
    compared: list[tuple[str, str, int]] = field(default_factory=list)


@dataclass
class Traced:
    """One trace's findings: the channel graph and the records beside it."""

    graph: ChannelGraph
    widths: Widths = field(default_factory=Widths)
    baked: Baked = field(default_factory=Baked)
    coverage: Coverage = field(default_factory=Coverage)
    conditioning: list[str] = field(default_factory=list)  # projections of a timestep's embedding: above

    def copy(self) -> Traced:
        """A copy to go on building (a second forward of the same trace): the model is shared,
        the bookkeeping is not."""
        return Traced(self.graph.copy(), *(_copy(getattr(self, f.name)) for f in fields(self)[1:]))


def _copy(record):
    if not is_dataclass(record):
        return copied(record)
    return type(record)(**{f.name: copied(getattr(record, f.name)) for f in fields(record)})

