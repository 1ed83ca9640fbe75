"""The pruning core: global threshold, never-empty guard, cfg/cfg_mask, and the equivalence
property (pruned network == original with the pruned channels' BN weight and bias zeroed)."""

import copy
import math
import random

import pytest
import torch
from conftest import random_cfg, randomize_bn, zeroed
from torch import nn

from slimming import channel_masks, checkpoint_dict, load_model, models, prune, save_checkpoint
from slimming.pruning.select import prunable_bns

PERCENTS = [0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 0.95]
FAMILIES = [("nin", None), ("vgg", 11), ("vgg", 13), ("vgg", 16), ("vgg", 19)]


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()


@pytest.mark.parametrize("arch,depth", FAMILIES)
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.slow
def test_pruned_equals_zeroed_original(arch, depth, seed):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    cfg = random_cfg(arch, rng, depth or 11)
    model = models.build(arch, cfg=cfg, num_classes=rng.randint(2, 12)).eval()
    randomize_bn(model, gen, zero_frac=rng.choice([0.0, 0.3, 0.6]))
    x = torch.randn(4, 3, 32, 32, generator=gen)
    for percent in PERCENTS:
        min_channels = rng.randint(1, 3)
        result = prune(model, percent=percent, min_channels=min_channels, compensate=False)
        # in float64: at float32 a deep VGG of two- and three-channel layers brings the output down
        # to 1e-6 and summation order alone (another CPU's kernels) moved it by 2e-4 of itself
        expected = zeroed(model, result.cfg_mask).double()(x.double())
        got = copy.deepcopy(result.model).double()(x.double())
        assert got.shape == expected.shape
        assert rel_diff(got, expected) < 1e-9, (arch, depth, cfg, percent)
        kept = [int(m.sum()) for m in result.cfg_mask]
        bns = [m for m in result.model.modules() if isinstance(m, nn.BatchNorm2d)]
        assert [bn.num_features for bn in bns] == kept  # cfg_mask describes the new network
        assert all(k >= min(min_channels, m.numel()) for k, m in zip(kept, result.cfg_mask))


@pytest.mark.parametrize("seed", range(5))
def test_percent_removes_exactly_floor_p_times_n_smallest(seed):
    gen = torch.Generator().manual_seed(seed)
    model = models.build("vgg", depth=11, num_classes=10)
    randomize_bn(model, gen)
    gammas = [bn.weight.detach().abs() for bn in prunable_bns(model)]
    flat = torch.cat(gammas)
    n = flat.numel()
    for percent in [0.0, 0.05, 0.29, 0.5, 0.7, 0.99]:
        masks, threshold = channel_masks(model, percent=percent)
        k = math.floor(percent * n + 1e-9)
        cut = flat.sort().values[k - 1].item() if k else -1.0  # gammas are distinct here
        guarded = 0
        for g, mask in zip(gammas, masks):
            if (g > cut).any():
                assert torch.equal(mask, g > cut)  # below the global cut: removed, above: kept
            else:  # the whole layer is under the cut: the guard keeps its largest channel
                assert torch.equal(mask, g == g.max())
                guarded += 1
        assert n - int(torch.cat(masks).sum()) == k - guarded
        assert threshold == (cut if k else None)


def test_threshold_removes_channels_at_or_below_it(tiny_vgg):
    randomize_bn(tiny_vgg, torch.Generator().manual_seed(1))
    t = 0.4
    masks, threshold = channel_masks(tiny_vgg, threshold=t)
    for bn, mask in zip(prunable_bns(tiny_vgg), masks):
        g = bn.weight.detach().abs()
        if (g > t).any():  # the guard does not step in
            assert torch.equal(mask, g > t)
    assert threshold == t


@pytest.mark.parametrize("min_channels", [1, 3])
def test_never_empty_guard_keeps_largest(tiny_vgg, min_channels):
    randomize_bn(tiny_vgg, torch.Generator().manual_seed(2))
    victim = prunable_bns(tiny_vgg)[2]
    with torch.no_grad():
        victim.weight.copy_(torch.linspace(1e-6, 1e-5, victim.num_features))
    result = prune(tiny_vgg.eval(), percent=0.5, min_channels=min_channels)
    mask = result.cfg_mask[2]
    assert int(mask.sum()) == min_channels
    assert mask[-min_channels:].all()  # the largest |gamma| in that layer survive


def test_guard_when_threshold_empties_a_layer(tiny_vgg):
    randomize_bn(tiny_vgg, torch.Generator().manual_seed(3))
    with torch.no_grad():
        prunable_bns(tiny_vgg)[0].weight.fill_(0.01)
    result = prune(tiny_vgg.eval(), threshold=0.05)
    assert result.cfg[0] == 1


def test_percent_zero_keeps_everything(tiny_vgg):
    randomize_bn(tiny_vgg, torch.Generator().manual_seed(4))
    result = prune(tiny_vgg.eval(), percent=0.0)
    assert result.cfg == tiny_vgg.cfg
    assert all(m.all() for m in result.cfg_mask)
    for (k, a), b in zip(tiny_vgg.state_dict().items(), result.model.state_dict().values()):
        assert torch.equal(a, b), k


@pytest.mark.parametrize("kwargs,match", [
    ({"percent": -0.1}, "percent"), ({"percent": 1.0}, "percent"),
    ({"percent": 1.5}, "percent"), ({"percent": float("nan")}, "percent"),
    ({"threshold": -1.0}, "threshold"), ({"threshold": 100.0}, "every"),
    ({"percent": 0.5, "threshold": 0.1}, "exactly one"), ({}, "exactly one"),
    ({"percent": 0.5, "min_channels": 0}, "min_channels"),
])
def test_refused_arguments(tiny_vgg, kwargs, match):
    with pytest.raises(ValueError, match=match):
        prune(tiny_vgg, **kwargs)


def test_model_without_bn_is_refused():
    class Plain(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)

    with pytest.raises(ValueError, match="no prunable BatchNorm2d"):
        channel_masks(Plain(), percent=0.5)


def test_cfg_mask_convention_for_nin():
    model = models.build("nin", cfg=[8, 7, 6, 5, 4, 3, 2, 9], num_classes=5).eval()
    randomize_bn(model, torch.Generator().manual_seed(5))
    result = prune(model, percent=0.6)
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert len(result.cfg_mask) == len(bns) == 9
    assert all(m.dtype == torch.bool for m in result.cfg_mask)
    assert result.cfg_mask[-1].all() and result.cfg_mask[-1].numel() == 5
    assert result.cfg == [int(m.sum()) for m in result.cfg_mask[:8]]
    assert [name for name, _, _ in result.layer_table()][0] == "feature.1"


def test_original_untouched_and_new_model_trainable(tiny_vgg):
    randomize_bn(tiny_vgg, torch.Generator().manual_seed(6))
    before = {k: v.clone() for k, v in tiny_vgg.state_dict().items()}
    result = prune(tiny_vgg, percent=0.5)
    for k, v in tiny_vgg.state_dict().items():
        assert torch.equal(v, before[k])
    new = result.model
    assert new.training and not any(p.is_meta for p in new.parameters())
    assert all(isinstance(p, nn.Parameter) and p.requires_grad for p in new.parameters())
    new(torch.randn(2, 3, 32, 32)).sum().backward()
    assert all(p.grad is not None for p in new.parameters())


@pytest.mark.parametrize("arch", ["vgg", "nin"])
def test_new_network_is_not_initialised_for_nothing(arch, init_calls):
    """No initialiser touches real memory while pruning: the new network lives on the meta
    device until the kept weights are assigned (PyTorch's own layer constructors still call
    theirs there, at no cost), and our families skip their own init loop entirely."""
    model = models.build(arch, cfg=[6] * 8 if arch == "nin" else [6, "M", 6, "M", 6, "M", 6, "M", 6])
    calls = init_calls
    calls.clear()  # the build above initialised for real
    prune(model, percent=0.5)
    assert all(is_meta for _, is_meta in calls)
    assert not {"kaiming_normal_", "constant_", "normal_"} & {name for name, _ in calls}
    calls.clear()
    models.build(arch, cfg=model.cfg)  # an ordinary build does initialise, on real memory
    assert calls and not any(is_meta for _, is_meta in calls)


def test_prune_twice_still_equivalent(tiny_vgg):
    randomize_bn(tiny_vgg, torch.Generator().manual_seed(7))
    model = tiny_vgg.eval()
    x = torch.randn(2, 3, 32, 32)
    once = prune(model, percent=0.3, compensate=False)
    twice = prune(once.model, percent=0.3, compensate=False)
    expected = zeroed(once.model, twice.cfg_mask)(x)
    assert rel_diff(twice.model(x), expected) < 1e-4


def test_pruned_checkpoint_round_trip(tiny_vgg, tmp_path):
    randomize_bn(tiny_vgg, torch.Generator().manual_seed(8))
    result = prune(tiny_vgg.eval(), percent=0.5)
    path = tmp_path / "pruned.pth"
    save_checkpoint(checkpoint_dict(result.model, cfg_mask=result.cfg_mask), path)
    raw = torch.load(path, weights_only=True)
    assert raw["cfg"] == result.cfg and len(raw["cfg_mask"]) == len(result.cfg_mask)
    loaded = load_model(path)
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(loaded(x), result.model(x))


def test_prune_warns_as_the_command_line_does_of_a_model_without_sparsity():
    """From Python too: cutting far more channels than sparsity training left near zero is a
    UserWarning, and a sparsity-trained model prunes without one."""
    import warnings

    model = models.build("vgg", cfg=[8, "M", 8, "M", 8, "M", 8, "M", 16])
    with warnings.catch_warnings(record=True) as dense:
        warnings.simplefilter("always")
        prune(model, percent=0.5)
    notes = [str(w.message) for w in dense if "little sparsity" in str(w.message)]
    assert len(notes) == 1 and "0.0% of the |gamma| (scaling factors) are under 0.01 but" in notes[0]
    with torch.no_grad():
        for bn in model.prunable_bns():
            bn.weight[: bn.num_features // 2] = 1e-4
    with warnings.catch_warnings(record=True) as sparse:
        warnings.simplefilter("always")
        result = prune(model, percent=0.5)
    assert result.ranked[1] > 0 and not [w for w in sparse if "little sparsity" in str(w.message)]


@pytest.mark.parametrize("percent", [0.1, 0.3, 0.5, 0.7])
def test_percent_cuts_exactly_its_share_of_the_ranked_channels(percent):
    """What ``percent`` counts: each channel that layers share once (a ResNet's residual stream
    is one channel for its five BatchNorms). floor(percent * ranked) of them go, whatever share
    of the BatchNorm layers' channels that makes, and the result says both, as the CLI prints."""
    import torchvision

    model = torchvision.models.resnet18(num_classes=10).eval()
    randomize_bn(model, torch.Generator().manual_seed(3))
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight[: m.num_features // 2] = 1e-4  # sparsity-trained: no warning about it
    result = prune(model, percent=percent, example_inputs=torch.zeros(1, 3, 32, 32), compensate=False)
    ranked, cut = result.ranked
    assert cut == math.floor(percent * ranked + 1e-9)  # as select counts (0.7 * 2880 is 2016)
    table = result.layer_table()
    assert ranked < sum(b for _, b, _ in table)  # shared channels counted once


class _Short:
    """A criterion of the user's that gives too few scores."""

    def __call__(self, model, group):
        return torch.ones(max(group.size - 1, 0))


BAD_PYTHON = [  # (keywords to prune, the parameter the error must name)
    (dict(percent="0.5"), "percent"), (dict(percent=True), "percent"), (dict(percent=math.nan), "percent"),
    (dict(percent=0.5, min_channels=1.5), "min_channels"), (dict(percent=0.5, round_to=0), "round_to"),
    (dict(percent=0.5, max_layer_prune="1"), "max_layer_prune"), (dict(threshold=math.inf), "threshold"),
    (dict(percent=0.5, importance=5), "importance"), (dict(percent=0.5, importance=_Short), "importance"),
    (dict(percent=0.5, importance=_Short()), "importance"),
    (dict(percent=0.5, importance=lambda m, g: torch.ones(g.size, 2)), "importance"),
    (dict(percent=0.5, surgery="graph", ignore=5), "ignore"),
    (dict(percent=0.5, surgery="graph", ignore=1.5), "ignore"), (dict(target_flops="0.5"), "target_flops"),
    (dict(target_params=math.nan), "target_params"),
    # hostile round 6: an integer too large for a float, a latency model of the wrong kind or
    # that nothing would use, a cut_heads that is no bool ('no' is true)
    *[(dict(**{k: 10 ** 400}), k) for k in ("percent", "threshold", "target_flops", "target_params",
                                            "target_latency")],
    *[(dict(percent=0.5, **{k: 10 ** 400}), k) for k in ("min_channels", "max_layer_prune", "round_to")],
    *[(dict(target_latency=0.5, latency_model=m), "latency_model")
      for m in (5, object(), "cpu", __import__("slimming").MeasuredLatency)],
    (dict(percent=0.5, latency_model=__import__("slimming").MeasuredLatency("cpu")), "latency_model"),
    *[(dict(percent=0.5, cut_heads=v), "cut_heads") for v in ("no", 0, None, 2)],
]


@pytest.mark.parametrize("surgery", ["auto", "graph"])
@pytest.mark.parametrize("kwargs,param", BAD_PYTHON, ids=[f"{p}-{i}" for i, (_, p) in enumerate(BAD_PYTHON)])
def test_odd_python_arguments_are_one_slimming_error_naming_the_parameter(kwargs, param, surgery):
    from slimming.errors import SlimmingError

    model = models.build("vgg", cfg=[8, "M", 8, "M", 8, "M", 8, "M", 16])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    kwargs = {"surgery": surgery, **kwargs}
    with pytest.raises(SlimmingError) as e:
        prune(model, **kwargs)
    assert param in e.value.params and "\n" not in str(e.value)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize("strength", [math.nan, math.inf, True, -1e-4, "1e-4"])
def test_a_sparsity_strength_that_would_poison_training_is_refused(strength):
    from slimming import BNSparsity
    from slimming.errors import SlimmingError

    with pytest.raises(SlimmingError) as e:
        BNSparsity(models.build("vgg", cfg=[8, "M", 8, "M", 8, "M", 8, "M", 16]), strength=strength)
    assert e.value.params == ("strength",)


def test_ignore_none_is_nothing_ignored():
    model = models.build("vgg", cfg=[8, "M", 8, "M", 8, "M", 8, "M", 16])
    a = prune(model, percent=0.5, surgery="graph", ignore=None, compensate=False)
    b = prune(model, percent=0.5, surgery="graph", compensate=False)
    assert a.cfg == b.cfg


def test_save_and_load_pruned_refuse_odd_arguments_in_one_line(tmp_path):
    from slimming import load_pruned, save_pruned
    from slimming.errors import SlimmingError

    model = models.build("vgg", cfg=[8, "M", 8, "M", 8, "M", 8, "M", 16])
    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_text("x")
    for call, param in [(lambda: save_pruned(model, tmp_path / "folder"), "path"),
                        (lambda: save_pruned(model, tmp_path / "file" / "x.pth"), "path"),
                        (lambda: save_pruned("vgg", tmp_path / "a.pth"), "model"),
                        (lambda: load_pruned(bytes(tmp_path / "a.pth"), model), "path"),
                        (lambda: load_pruned(tmp_path / "a.pth", "vgg"), "model")]:
        with pytest.raises(SlimmingError) as e:
            call()
        assert e.value.params == (param,) and "\n" not in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "folder"]  # nothing written
    assert (tmp_path / "file").read_text() == "x" and not list((tmp_path / "folder").iterdir())


def test_a_weight_cut_along_two_dims_in_one_pass_is_the_two_cuts_one_after_the_other():
    """utils.modules.keep_along, which the layer rules cut with: a convolution's weight cut
    along its outputs and inputs at once (one gather over the kept kernels) holds exactly what
    index_select along one dim and then the other gives, over random shapes, masks, dims in
    either order and a channels-last weight, in new memory."""
    from slimming.utils.modules import keep_along

    gen = torch.Generator().manual_seed(0)
    for i in range(100):
        shape = [int(n) for n in torch.randint(1, 9, (int(torch.randint(2, 6, (1,), generator=gen)),),
                                                generator=gen)]
        t = torch.randn(shape, generator=gen)
        if t.dim() == 4 and i % 3 == 0:
            t = t.to(memory_format=torch.channels_last)
        masks = [torch.rand(n, generator=gen) < 0.6 for n in shape[:2]]
        for m in masks:
            m[int(torch.randint(len(m), (1,), generator=gen))] = True
        cuts = [(0, masks[0]), (1, masks[1])][::(-1) ** i]
        want = t.index_select(0, masks[0].nonzero().flatten()).index_select(1, masks[1].nonzero().flatten())
        got = keep_along(t, cuts)
        assert torch.equal(got, want) and got.data_ptr() != t.data_ptr()
        dim, mask = cuts[0]
        assert torch.equal(keep_along(t, cuts[:1]), t.index_select(dim, mask.nonzero().flatten()))
