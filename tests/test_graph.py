"""Pruning any CNN through its traced channel graph (slimming.pruning.graph, slimming.pruning.surgery).

The core property, for every supported model: the pruned network's outputs equal the
original's with, for every pruned channel, gamma and beta zeroed in every BatchNorm of its
group (eval mode), over random sparsity-shaped gammas and percents 0.1 to 0.9."""

import random

import pytest
import torch
from conftest import random_cfg, randomize_bn, rel_diff, sparsity_shaped, zeroed
from torch import nn

import slimming
from slimming import models
from slimming.pruning.graph import GraphError
from slimming.pruning.importance import BNScale
from slimming.pruning.trace import trace

torchvision = pytest.importorskip("torchvision")

TORCHVISION = ["resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_small", "vgg11_bn", "densenet121",
               "efficientnet_b0", "regnet_x_400mf"]
TIMM = ["resnet18", "efficientnet_b0"]


def build(source: str, name: str) -> nn.Module:
    if source == "timm":
        timm = pytest.importorskip("timm")
        return timm.create_model(name, pretrained=False, num_classes=10)
    return torchvision.models.get_model(name, weights=None, num_classes=10)


@pytest.fixture(scope="module", autouse=True)
def threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("source,name", [("torchvision", n) for n in TORCHVISION]
                         + [("timm", n) for n in TIMM], ids=lambda v: v)
@pytest.mark.slow
def test_pruned_equals_the_original_with_the_cut_channels_zeroed(source, name):
    model = build(source, name).eval()
    sparsity_shaped(model, seed=len(name))
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    params = sum(p.numel() for p in model.parameters())
    for percent in (0.1, 0.5, 0.9):
        result = slimming.prune(model, percent=percent, example_inputs=x[:1], compensate=False)
        with torch.no_grad():
            assert rel_diff(result.model(x), zeroed(model, result.masks)(x)) < 1e-4, percent
        removed = sum(int((~m).sum()) for m in result.masks.values())
        assert removed > 0 and sum(p.numel() for p in result.model.parameters()) < params
        assert set(result.masks) == {n for n, m in model.named_modules()
                                     if isinstance(m, nn.BatchNorm2d)}
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # untouched


@pytest.mark.parametrize("arch", ["vgg11", "vgg16", "vgg19", "nin"])
@pytest.mark.slow
def test_the_traced_path_agrees_with_the_families_surgery(arch):
    """Two independent cuts of the same network check each other: same channels, same outputs."""
    rng = random.Random(arch)
    depth = int(arch[3:]) if arch.startswith("vgg") else None
    for trial in range(2):
        family = arch[:3]
        model = models.build(family, cfg=random_cfg(family, rng, depth=depth or 11),
                             **({"depth": depth} if depth else {})).eval()
        randomize_bn(model, torch.Generator().manual_seed(trial), zero_frac=0.4)
        x = torch.randn(2, 3, 32, 32)
        for percent in (0.0, 0.3, 0.7, 0.95):
            hand = slimming.prune(model, percent=percent)
            traced = slimming.prune(model, percent=percent, surgery="graph")
            assert all(torch.equal(a, b) for a, b in zip(hand.cfg_mask, traced.cfg_mask))
            with torch.no_grad():
                assert torch.allclose(hand.model(x), traced.model(x), atol=1e-5)


def test_residual_sums_tie_their_batchnorms_into_one_group():
    model = torchvision.models.resnet18(num_classes=10).eval()
    groups = trace(model, torch.zeros(1, 3, 64, 64)).graph.groups()
    stream = next(g for g in groups if any(b[0] == "bn1" for b in g.bns))
    assert {b[0] for b in stream.bns} == {"bn1", "layer1.0.bn2", "layer1.1.bn2"}
    stage2 = next(g for g in groups if any(b[0] == "layer2.0.downsample.1" for b in g.bns))
    assert {b[0] for b in stage2.bns} == {"layer2.0.bn2", "layer2.1.bn2", "layer2.0.downsample.1"}
    assert stream.prunable and stage2.prunable


def test_depthwise_convolutions_shrink_with_the_channels_they_carry():
    model = torchvision.models.mobilenet_v2(num_classes=10).eval()
    sparsity_shaped(model, 3)
    result = slimming.prune(model, percent=0.5, example_inputs=torch.zeros(1, 3, 64, 64))
    dw = result.model.features[2].conv[1][0]  # expand -> depthwise -> project
    kept = int(result.masks["features.2.conv.0.1"].sum())
    assert dw.groups == dw.in_channels == dw.out_channels == kept == dw.weight.shape[0]
    assert torch.equal(result.masks["features.2.conv.0.1"], result.masks["features.2.conv.1.1"])


@pytest.mark.slow
def test_concatenations_map_each_input_to_its_slice():
    model = torchvision.models.densenet121(num_classes=10).eval()
    sparsity_shaped(model, 4)
    result = slimming.prune(model, percent=0.5, example_inputs=torch.zeros(1, 3, 64, 64))
    norm = result.masks["features.denseblock1.denselayer2.norm1"]  # reads stem + layer 1's output
    assert torch.equal(norm[:64], result.masks["features.norm0"])
    conv = result.model.features.denseblock1.denselayer2.conv1
    assert conv.in_channels == int(norm.sum())


def test_ignore_keeps_a_modules_channels():
    model = torchvision.models.resnet18(num_classes=10).eval()
    sparsity_shaped(model, 5)
    result = slimming.prune(model, percent=0.6, example_inputs=torch.zeros(1, 3, 64, 64),
                            ignore=("layer1.0.conv1",))
    assert result.model.layer1[0].conv1.out_channels == 64 and result.masks["layer1.0.bn1"].all()
    # what it reads (the stream) is cut where it is made, as by any other reader
    assert result.model.layer1[0].conv1.in_channels == int(result.masks["bn1"].sum()) < 64
    whole = slimming.prune(model, percent=0.6, example_inputs=torch.zeros(1, 3, 64, 64),
                           keep_whole=("layer1.0.conv1",))
    assert whole.model.layer1[0].conv1.in_channels == 64  # keep_whole: what it reads is kept too
    assert whole.masks["layer1.0.bn2"].all() and not whole.masks["layer2.0.bn1"].all()


def test_the_classifier_and_the_input_keep_their_width():
    model = torchvision.models.resnet18(num_classes=7).eval()
    sparsity_shaped(model, 6)
    result = slimming.prune(model, percent=0.9, example_inputs=torch.zeros(1, 3, 64, 64))
    assert result.model.fc.out_features == 7 and result.model.conv1.in_channels == 3


class ChannelShuffle(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x):
        x = self.bn(self.conv(x))
        n, c, h, w = x.shape
        return x.view(n, 2, c // 2, h, w).transpose(1, 2).reshape(n, c, h, w).mean((2, 3))


class Rolled(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x):
        return torch.roll(self.bn(self.conv(x)), 1, dims=1)


@pytest.mark.parametrize("model,needle", [(ChannelShuffle(), "channel shuffle"), (Rolled(), "roll")],
                         ids=["shuffle", "roll"])
def test_where_nothing_can_be_cut_the_refusal_says_what_kept_it_and_changes_nothing(model, needle):
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(GraphError) as e:
        slimming.prune(model, percent=0.5, example_inputs=torch.zeros(1, 3, 32, 32))
    assert needle in str(e.value) and "can be cut" in str(e.value) and "\n" not in str(e.value)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_an_op_it_cannot_follow_keeps_its_channels_and_the_rest_is_cut_exactly():
    """ShuffleNetV2's channel shuffle: the shuffled channels are kept, named in one warning
    line by module type; every other channel is cut, and the network is exact."""
    model = torchvision.models.shufflenet_v2_x0_5(num_classes=10).eval()
    sparsity_shaped(model, 2)
    before = sum(p.numel() for p in model.parameters())
    with pytest.warns(UserWarning, match=r"view \(a reshape .* channel shuffle.*\) in InvertedResidual") as w:
        result = slimming.prune(model, percent=0.5, example_inputs=torch.zeros(1, 3, 32, 32),
                                compensate=False)
    assert len([x for x in w if "cannot follow" in str(x.message)]) == 1
    assert sum(p.numel() for p in result.model.parameters()) < 0.9 * before
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert rel_diff(result.model(x), zeroed(model, result.masks)(x)) < 1e-4


def test_grouped_convolutions_are_cut_by_equal_counts_in_every_group():
    model = torchvision.models.regnet_x_400mf(num_classes=10).eval()
    sparsity_shaped(model, 7)
    result = slimming.prune(model, percent=0.5, example_inputs=torch.zeros(1, 3, 64, 64))
    block = "trunk_output.block1.block1-0.f"
    old, new = model.get_submodule(f"{block}.b.0"), result.model.get_submodule(f"{block}.b.0")
    assert new.groups == old.groups and new.out_channels < old.out_channels
    for name, width in ((f"{block}.a.1", new.in_channels), (f"{block}.b.1", new.out_channels)):
        counts = result.masks[name].view(old.groups, -1).sum(1)
        assert (counts == counts[0]).all() and int(counts.sum()) == width


def test_group_scores_max_mean_and_sum():
    model = torchvision.models.resnet18(num_classes=10).eval()
    graph = trace(model, torch.zeros(1, 3, 64, 64)).graph
    stream = next(g for g in graph.groups() if len(g.bns) == 3)
    with torch.no_grad():
        for i, (name, *_rest) in enumerate(stream.bns):
            model.get_submodule(name).weight.fill_(float(i + 1))  # 1, 2, 3
    assert torch.equal(BNScale("max")(model, stream), torch.full((stream.size,), 3.0))
    assert torch.equal(BNScale("mean")(model, stream), torch.full((stream.size,), 2.0))
    assert torch.equal(BNScale("sum")(model, stream), torch.full((stream.size,), 6.0))
    with pytest.raises(slimming.SlimmingError, match="unknown group score"):
        BNScale("median")


def test_the_pruned_copy_shares_no_tensor_with_the_original():
    model = torchvision.models.resnet18(num_classes=10).eval()
    sparsity_shaped(model, 8)
    result = slimming.prune(model, percent=0.3, example_inputs=torch.zeros(1, 3, 64, 64),
                            ignore=("layer4.1.conv2",))
    ours = {t.data_ptr() for t in (*model.parameters(), *model.buffers()) if t.numel()}
    theirs = {t.data_ptr() for t in (*result.model.parameters(), *result.model.buffers()) if t.numel()}
    assert not ours & theirs
    assert set(vars(model)) == set(vars(torchvision.models.resnet18(num_classes=10)))  # nothing parked


def test_permutation_agrees_with_torch_on_random_permuting_calls():
    """``ops.permutation`` (where each output dim comes from) against torch itself, on tensors
    whose dims all have different sizes, for random permute / transpose / movedim calls."""
    from slimming.pruning.ops import permutation
    g = torch.Generator().manual_seed(0)
    for _ in range(300):
        n = int(torch.randint(2, 6, (1,), generator=g))
        x = torch.zeros(*range(2, n + 2))
        op = ["permute", "transpose", "movedim", "mT", "swapaxes"][int(torch.randint(5, (1,), generator=g))]

        def r(n=n):
            return int(torch.randint(-n, n, (1,), generator=g))
        if op == "permute":
            args = (x, torch.randperm(n, generator=g).tolist())
            out = x.permute(*args[1])
        elif op in ("transpose", "swapaxes"):
            args = (x, r(), r())
            out = getattr(x, op)(args[1], args[2])
        elif op == "movedim":
            k = int(torch.randint(1, n + 1, (1,), generator=g))
            args = (x, *(torch.randperm(n, generator=g)[:k].tolist() for _ in range(2)))
            out = x.movedim(args[1], args[2])
        else:
            args, out = (x,), x.mT
        perm = permutation(op, args, {}, n)
        assert [x.shape[p] for p in perm] == list(out.shape), (op, args[1:])
