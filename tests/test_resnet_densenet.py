"""The pre-activation ResNet and DenseNet families: layout, parameter counts, and pruning through
channel selection (the pruned network == the original with the pruned channels' BN zeroed)."""

import copy
import random
import warnings

import pytest
import torch
from conftest import randomize_bn, zeroed
from test_prune import rel_diff
from torch import nn

from slimming import BNSparsity, checkpoint_dict, count_params, load_model, models, prune, save_checkpoint
from slimming.models.common import ChannelSelect
from slimming.pruning.surgery import copy_sliced_weights

SMALL = [("preresnet", 11), ("preresnet", 20), ("densenet", 10), ("densenet", 16)]
PERCENTS = [0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 0.95]


pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def bns_of(model: nn.Module) -> list[nn.BatchNorm2d]:
    return [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]


def test_parameter_counts_match_the_paper():
    # the paper's Table 1: ResNet-164 1.70M; DenseNet-40 1.02M (its count; 1.06M here, as in
    # other reimplementations of the same growth-12, no-compression network)
    assert round(count_params(models.build("preresnet", empty=True)) / 1e6, 2) == 1.70
    assert 1.02e6 <= count_params(models.build("densenet", empty=True)) <= 1.07e6


def test_preresnet_layout_and_names():
    model = models.build("preresnet", depth=20, num_classes=7)
    assert model.options == {"depth": 20, "num_classes": 7} and len(model.cfg) == 9 * 2 + 1
    assert [n for n, _ in model.named_children()] == ["conv1", "layer1", "layer2", "layer3", "bn",
                                                      "select", "relu", "fc"]
    block = model.layer2[0]
    assert [n for n, _ in block.named_children()] == ["bn1", "select", "conv1", "bn2", "conv2", "bn3",
                                                      "conv3", "relu", "downsample"]
    keys = model.state_dict().keys()
    assert {f"layer{s}.0.downsample.0.weight" for s in (1, 2, 3)} <= keys
    assert not any(k.startswith(f"layer{s}.1.downsample") for k in keys for s in (1, 2, 3))
    assert model.cfg[:6] == [16, 16, 16, 64, 16, 16] and model.cfg[-1] == 256  # the paper's cfg
    assert model.prunable_bns() == bns_of(model) and len(bns_of(model)) == len(model.cfg)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 7)


def test_densenet_layout_and_names():
    model = models.build("densenet", depth=10)
    assert [n for n, _ in model.named_children()] == ["conv1", "dense1", "trans1", "dense2", "trans2",
                                                      "dense3", "bn", "select", "relu", "fc"]
    assert [n for n, _ in model.dense1[0].named_children()] == ["bn1", "select", "conv1", "relu"]
    assert model.conv1.out_channels == 24 and model.dense2[1].conv1.out_channels == 12
    assert model.cfg == [24, 36, 48, 48, 60, 72, 72, 84, 96]  # what each BN reads, as the paper's
    assert model.trans1.conv1.out_channels == 48  # no compression
    assert model.prunable_bns() == bns_of(model) and len(bns_of(model)) == len(model.cfg)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)


@pytest.mark.parametrize("arch,cfg,options,match", [
    ("preresnet", None, {"depth": 19}, "9n\\+2"),
    ("preresnet", None, {"depth": 2}, "9n\\+2"),
    ("preresnet", [16] * 9, {"depth": 11}, "10 positive widths"),
    ("preresnet", [17, 16, 16, 64, 32, 32, 128, 64, 64, 256], {"depth": 11}, "more channels"),
    ("preresnet", [16, 16, 16, 64, 32, 32, 128, 64, 64, 257], {"depth": 11}, "more channels"),
    ("preresnet", [16, 0, 16, 64, 32, 32, 128, 64, 64, 256], {"depth": 11}, "positive"),
    ("densenet", None, {"depth": 41}, "3n\\+4"),
    ("densenet", None, {"depth": 4}, "3n\\+4"),
    ("densenet", [24, 36, 48, 48, 60, 72, 72, 84, 97], {"depth": 10}, "more channels"),
    ("densenet", [24] * 8, {"depth": 10}, "9 positive"),
])
def test_build_refuses_bad_depth_or_cfg(arch, cfg, options, match):
    with pytest.raises(ValueError, match=match):
        models.build(arch, cfg=cfg, **options)


@pytest.mark.parametrize("arch,depth", SMALL[::2])
def test_init_and_persistent_index_buffers(arch, depth):
    model = models.build(arch, depth=depth)
    assert all(torch.all(bn.weight == 0.5) and torch.all(bn.bias == 0) for bn in bns_of(model))
    selects = [(n, m) for n, m in model.named_modules() if isinstance(m, ChannelSelect)]
    entries = [n for n, _ in model.named_modules() if n == "bn" or n.endswith(".bn1")]
    assert [n for n, _ in selects] == [n[:-3] + "select" for n in entries]  # one per entry BN
    state = model.state_dict()
    for name, _ in selects:
        index = state[f"{name}.index"]  # persistent: it travels with the weights
        assert index.dtype == torch.int64 and torch.equal(index, torch.arange(index.numel()))
    assert all(p.is_meta for p in models.build(arch, depth=depth, empty=True).buffers())


@pytest.mark.parametrize("arch,depth", SMALL)
@pytest.mark.parametrize("seed", range(2))
@pytest.mark.slow
def test_pruned_equals_zeroed_original(arch, depth, seed):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    model = models.build(arch, depth=depth, num_classes=rng.randint(2, 12)).eval()
    randomize_bn(model, gen, zero_frac=rng.choice([0.0, 0.3, 0.6]))
    x = torch.randn(3, 3, 32, 32, generator=gen)
    for percent in PERCENTS:
        min_channels = rng.randint(1, 3)
        result = prune(model, percent=percent, min_channels=min_channels, compensate=False)
        expected = zeroed(model, result.cfg_mask)(x)
        assert rel_diff(result.model(x), expected) < 1e-4, (arch, depth, percent)
        kept = [int(m.sum()) for m in result.cfg_mask]
        assert result.cfg == kept == result.model.cfg
        assert [bn.num_features for bn in bns_of(result.model)] == kept
        assert all(k >= min(min_channels, m.numel()) for k, m in zip(kept, result.cfg_mask))
        # Net(cfg) rebuilds any pruned cfg; the index buffers come with the state_dict
        rebuilt = models.build(arch, cfg=result.cfg, **result.model.options).eval()
        rebuilt.load_state_dict(result.model.state_dict())
        assert torch.equal(rebuilt(x), result.model(x))
        # prune the pruned network: masks now cover each BN's own (already narrower) channels
        twice = prune(result.model, percent=rng.choice([0.2, 0.5]), min_channels=min_channels,
                      compensate=False)
        assert [m.numel() for m in twice.cfg_mask] == kept
        expected = zeroed(result.model, twice.cfg_mask)(x)
        assert rel_diff(twice.model(x), expected) < 1e-4, (arch, depth, percent, "twice")


@pytest.mark.parametrize("arch,depth", SMALL[1::2])
def test_equivalence_holds_in_training_mode_too(arch, depth):
    """select -> bn1 normalises the kept channels with the same batch statistics as the paper's
    bn1 -> select: per channel, nothing changes, in training as in evaluation."""
    gen = torch.Generator().manual_seed(3)
    model = models.build(arch, depth=depth)
    randomize_bn(model, gen, zero_frac=0.3)
    result = prune(model, percent=0.5, compensate=False)
    ref = zeroed(model, result.cfg_mask).train()
    x = torch.randn(4, 3, 32, 32, generator=gen)
    assert result.model.training
    assert rel_diff(result.model(x), ref(x)) < 1e-4


def layer_tiny(model, gen):
    with torch.no_grad():
        for bn in bns_of(model):
            bn.weight.copy_(torch.rand(bn.num_features, generator=gen) + 0.1)
        for i in (1, 5, len(bns_of(model)) // 2, -1):  # whole layers far under everything else
            bns_of(model)[i].weight.uniform_(-1e-6, 1e-6, generator=gen)


def sparse_shape(model, gen):
    with torch.no_grad():
        for bn in bns_of(model):
            n = bn.num_features
            small = torch.rand(n, generator=gen) < 0.6
            bn.weight.copy_(torch.where(small, 1e-3 * torch.randn(n, generator=gen),
                                        0.1 + 0.9 * torch.rand(n, generator=gen)))


def all_equal(model, gen):  # ties everywhere: broken by layer order, emptying early layers
    with torch.no_grad():
        for bn in bns_of(model):
            bn.weight.fill_(0.3)


@pytest.mark.parametrize("arch", ["preresnet", "densenet"])
@pytest.mark.parametrize("gammas", [randomize_bn, layer_tiny, sparse_shape, all_equal])
@pytest.mark.slow
def test_full_depth_prunes_at_60_percent_for_any_gammas(arch, gammas):
    """ResNet-164 and DenseNet-40 at 60%, whatever the gammas: the paper's code crashes when a
    layer empties; here the guard keeps a channel, and the network still runs and agrees."""
    gen = torch.Generator().manual_seed(4)
    model = models.build(arch, num_classes=100).eval()
    randomize_bn(model, gen)
    gammas(model, gen)
    result = prune(model, percent=0.6, compensate=False)
    n = sum(m.numel() for m in result.cfg_mask)
    assert n - sum(result.cfg) <= int(0.6 * n) and min(result.cfg) >= 1
    x = torch.randn(1, 3, 32, 32, generator=gen)
    assert rel_diff(result.model(x), zeroed(model, result.cfg_mask)(x)) < 1e-4
    assert count_params(result.model) < count_params(model)


@pytest.mark.parametrize("arch,depth", SMALL[::2])
@pytest.mark.slow
def test_pruned_network_scripts_and_exports(arch, depth):
    gen = torch.Generator().manual_seed(5)
    model = models.build(arch, depth=depth).eval()
    randomize_bn(model, gen, zero_frac=0.5)
    pruned = prune(model, percent=0.5).model
    x = torch.randn(2, 3, 32, 32, generator=gen)
    want = pruned(x)
    exported = torch.export.export(pruned, (x,)).module()
    assert torch.allclose(exported(x), want, atol=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit is deprecated in favour of torch.export
        scripted = torch.jit.script(pruned)
    assert torch.allclose(scripted(x), want, atol=1e-6)


@pytest.mark.parametrize("arch,depth", SMALL[::2])
def test_pruned_checkpoint_round_trip(arch, depth, tmp_path):
    gen = torch.Generator().manual_seed(6)
    model = models.build(arch, depth=depth).eval()
    randomize_bn(model, gen, zero_frac=0.4)
    result = prune(model, percent=0.5)
    path = tmp_path / "pruned.pth"
    save_checkpoint(checkpoint_dict(result.model, cfg_mask=result.cfg_mask), path)
    raw = torch.load(path, weights_only=True)
    assert raw["arch"] == arch and raw["cfg"] == result.cfg and raw["options"]["depth"] == depth
    assert any(k.endswith("select.index") for k in raw["state_dict"])
    loaded = load_model(path)
    x = torch.randn(2, 3, 32, 32, generator=gen)
    assert torch.equal(loaded(x), result.model(x))
    save_checkpoint(checkpoint_dict(model), tmp_path / "full.pth")
    assert torch.load(tmp_path / "full.pth", weights_only=True)["cfg"] is None


@pytest.mark.parametrize("arch,depth", SMALL[::2])
def test_new_network_is_not_initialised_for_nothing(arch, depth, init_calls):
    model = models.build(arch, depth=depth)
    calls = init_calls
    calls.clear()
    prune(model, percent=0.5)
    assert not {"kaiming_normal_", "constant_"} & {name for name, _ in calls}


def test_sparsity_reaches_every_bn():
    model = models.build("preresnet", depth=11)
    assert len(BNSparsity(model, 1e-4).params) == len(bns_of(model)) == len(model.cfg)


def test_surgery_checks_its_masks():
    model = models.build("densenet", depth=7)
    new = copy.deepcopy(model)
    masks = [torch.ones(bn.num_features, dtype=torch.bool) for bn in bns_of(model)]
    with pytest.raises(ValueError, match="masks"):
        copy_sliced_weights(model, new, masks[:-1])
    masks[0] = torch.ones(masks[0].numel() + 1, dtype=torch.bool)
    with pytest.raises(ValueError, match="mask of"):
        copy_sliced_weights(model, new, masks)
