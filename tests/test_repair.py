"""Pruning that keeps what sparsity bought: compensation, BatchNorm recalibration, budgets,
rounded widths, a per-layer cap, and the sparsity controller from the command line."""

import json
import math
import random

import pytest
import torch
from conftest import randomize_bn, sparsity_shaped, zeroed
from torch import nn

import slimming
from slimming import models
from slimming.cli import main
from slimming.measure.stats import channels_last_note, count_flops, count_params
from slimming.pruning.repair import recalibrate_bn

SMALL_VGG = [16, "M", 16, "M", 16, 16, "M", 16, "M", 16]


def bns(model):
    return [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]


def distance(a, b) -> float:
    return (a - b).norm().item()


@pytest.mark.parametrize("arch,hold,percents", [("nin", (2, 5), (0.1, 0.3)),
                                                ("vgg", tuple(range(5)), (0.05, 0.15))])
def test_compensation_is_exact_where_the_readers_are_1x1_or_linear(arch, hold, percents):
    """NIN's BNs read by 1x1 convs (all but the two before a padded conv), VGG's last BN (read
    by the classifier after pooling): pruned + compensated equals the gamma-zeroed original."""
    model = models.build(arch, cfg=SMALL_VGG if arch == "vgg" else [12] * 8).eval()
    randomize_bn(model, torch.Generator().manual_seed(1), zero_frac=0.5)
    with torch.no_grad():
        for i, bn in enumerate(bns(model)):
            bn.bias.abs_()  # betas the ReLU lets through: a constant that matters
            if i in hold:
                bn.weight.fill_(5.0)  # never cut
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))  # not the global RNG
    for percent in percents:  # only the BNs not held: the last one, for VGG
        result = slimming.prune(model, percent=percent)
        assert result.compensation["applied"] and result.compensation["unfolded"] == 0
        plain = slimming.prune(model, percent=percent, compensate=False)
        with torch.no_grad():
            reference = zeroed(model, result.masks, beta=False)(x)
            assert (result.model(x) - reference).abs().max() < 1e-4
            assert (plain.model(x) - reference).abs().max() > 1e-2  # what the paper's cut loses


def _models():
    rng = random.Random(0)
    for _ in range(6):
        yield "vgg", models.build("vgg", cfg=[v if v == "M" else rng.randint(4, 24) for v in SMALL_VGG])
        yield "nin", models.build("nin", cfg=[rng.randint(4, 24) for _ in range(8)])
    yield "preresnet", models.build("preresnet", depth=20)
    yield "densenet", models.build("densenet", depth=10)
    tv = pytest.importorskip("torchvision")
    yield "resnet18", models.build("torchvision:resnet18", num_classes=10, input_size=[3, 64, 64])
    yield "mobilenet_v2", models.build(f"{tv.__name__}:mobilenet_v2", num_classes=10, input_size=[3, 64, 64],
                                       kwargs={"width_mult": 0.5})


@pytest.mark.slow
def test_compensated_is_never_further_from_the_gamma_zeroed_original():
    for i, (name, model) in enumerate(_models()):
        model.eval()
        randomize_bn(model, torch.Generator().manual_seed(i), zero_frac=0.5)
        size = tuple(getattr(model, "input_size", None) or (3, 32, 32))
        x = torch.randn(4, *size, generator=torch.Generator().manual_seed(100 + i))
        for percent in (0.2, 0.5, 0.8):
            result = slimming.prune(model, percent=percent)
            plain = slimming.prune(model, percent=percent, compensate=False)
            with torch.no_grad():
                reference = zeroed(model, result.masks, beta=False)(x)
                assert distance(result.model(x), reference) <= distance(plain.model(x), reference) * 1.01, \
                    (name, percent)


def test_a_padded_reader_is_nearly_exact():
    """One cut layer, read by a padded 3x3 conv (on a 16x16 map, after pooling): the fold is
    the average of what the conv received, so away from the border the result differs from
    the gamma-zeroed original by one constant per channel; overall far closer than leaving
    the constant out."""
    model = models.build("vgg", cfg=SMALL_VGG).eval()
    randomize_bn(model, torch.Generator().manual_seed(2))
    with torch.no_grad():
        for i, bn in enumerate(bns(model)):
            bn.bias.abs_()
            bn.weight.abs_().add_(1.0)
            if i == 0:
                bn.weight[:6] = 1e-4  # only these go
    result = slimming.prune(model, threshold=1e-3)
    plain = slimming.prune(model, threshold=1e-3, compensate=False)
    assert result.layers["feature.4"]["in"].sum() == 10

    def after_conv(net, x):  # what the next BN gives (the ReLU after it works in place)
        seen = {}

        def keep(m, args, out):  # returns None: the forward goes on unchanged
            seen["x"] = out.clone()

        h = net.feature[5].register_forward_hook(keep)
        with torch.no_grad():
            net(x)
        h.remove()
        return seen["x"]

    x = torch.randn(2, 3, 32, 32)
    reference = after_conv(zeroed(model, result.masks, beta=False), x)
    ours, paper = after_conv(result.model, x), after_conv(plain.model, x)
    assert distance(ours, reference) < 0.5 * distance(paper, reference)
    inner = (slice(None), slice(None), slice(2, -2), slice(2, -2))  # the same away from the border
    offset = (ours - reference)[inner]
    assert (offset - offset.mean((2, 3), keepdim=True)).abs().max() < 1e-4


def test_what_cannot_be_folded_is_counted():
    model = models.build("preresnet", depth=20).eval()
    randomize_bn(model, torch.Generator().manual_seed(3), zero_frac=0.6)
    result = slimming.prune(model, percent=0.5)
    c = result.compensation
    assert c["folded"] > 0 and c["unfolded"] > 0  # conv3 feeds the residual sum: no place


def test_recalibration_reestimates_the_statistics_and_touches_nothing_else():
    model = models.build("vgg", cfg=SMALL_VGG)
    batches = [(torch.randn(8, 3, 32, 32), torch.zeros(8, dtype=torch.long)) for _ in range(3)]
    weights = {k: v.clone() for k, v in model.state_dict().items() if "running" not in k
               and "num_batches" not in k}
    seen = recalibrate_bn(model, batches, 2)
    assert seen == 16
    first = model.feature[1]
    with torch.no_grad():
        z = model.feature[0](torch.cat([b[0] for b in batches[:2]]))
    assert torch.allclose(first.running_mean, z.mean((0, 2, 3)), atol=1e-5)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in weights.items())
    assert first.momentum == 0.1 and model.training


@pytest.mark.parametrize("arch,options", [("vgg", {"depth": 19}), ("preresnet", {"depth": 56}),
                                          ("densenet", {"depth": 22})])
@pytest.mark.slow
def test_a_flops_budget_is_met_as_closely_as_the_channels_allow(arch, options):
    model = models.build(arch, **options).eval()
    sparsity_shaped(model)
    full = count_flops(model)
    result = slimming.prune(model, target_flops=0.5)
    achieved = count_flops(result.model)
    assert result.budget.achieved == achieved and achieved <= 0.5 * full
    assert achieved >= 0.98 * 0.5 * full  # within 2% of the budget
    params = count_params(model)
    result = slimming.prune(model, target_params=int(0.4 * params), compensate=False)
    assert 0.97 * 0.4 * params <= count_params(result.model) <= 0.4 * params


def test_budgets_on_a_traced_network_and_the_impossible_one():
    tv = pytest.importorskip("torchvision")
    model = tv.models.resnet18(num_classes=10).eval()
    randomize_bn(model, torch.Generator().manual_seed(4))
    example = torch.zeros(1, 3, 32, 32)
    result = slimming.prune(model, target_flops=0.6, example_inputs=example)
    assert count_flops(result.model) <= 0.6 * count_flops(model)
    with pytest.raises(slimming.SlimmingError, match="cannot be met"):
        slimming.prune(model, target_params=50, example_inputs=example)
    with pytest.raises(slimming.SlimmingError, match="at or above"):
        slimming.prune(model, target_flops=2e12, example_inputs=example)


@pytest.mark.parametrize("arch", ["vgg", "torchvision"])
def test_rounded_widths_and_the_per_layer_cap(arch):
    if arch == "vgg":
        model = models.build("vgg", depth=11).eval()
    else:
        pytest.importorskip("torchvision")
        model = models.build("torchvision:resnet18", num_classes=10, input_size=[3, 32, 32]).eval()
    randomize_bn(model, torch.Generator().manual_seed(5), zero_frac=0.7)
    result = slimming.prune(model, percent=0.6, round_to=16, max_layer_prune=0.75)
    for name, keep in result.masks.items():
        n, kept = keep.numel(), int(keep.sum())
        assert kept % 16 == 0 or kept == n, (name, kept)
        assert kept >= math.ceil(0.25 * n), (name, kept)
    plain = slimming.prune(model, percent=0.6)
    assert sum(int(m.sum()) for m in result.masks.values()) >= sum(int(m.sum()) for m in plain.masks.values())


@pytest.mark.slow
def test_sparsity_target_from_the_command_line(tmp_path, capsys):
    """From a start 100x too low, the controller finds its strength within the first epoch
    (it steers every tenth of an epoch) and reaches the target; the strength of each epoch's
    start and end is logged, and saved for --resume."""
    save = tmp_path / "run"
    argv = ["train", "--cfg", "16,M,32,M,32,M,32,M,32", "--epochs", "6", "--sparsity", "1e-4",
            "--sparsity-target", "0.5", "--seed", "0", "--dataset", "synthetic", "--cpu",
            "--batch-size", "32", "--save", str(save)]
    assert main(argv) == 0
    rows = [json.loads(line) for line in (save / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["sparsity"] == 1e-4 and rows[0]["sparsity_end"] > 1e-3
    for before, after in zip(rows, rows[1:]):
        assert after["sparsity"] == before["sparsity_end"]
        if after["lr"] < 0.05:  # the learning rate fell: never raised
            assert after["sparsity_end"] <= after["sparsity"]
    assert abs(rows[-1]["gamma_lt_1e-2"] - 0.5) <= 0.05, [r["gamma_lt_1e-2"] for r in rows]
    last = torch.load(save / "last.pth", weights_only=True)
    assert last["sparsity_strength"] == pytest.approx(rows[-1]["sparsity_end"])  # what --resume continues
    assert last["sparsity_peak_lr"] == pytest.approx(0.1)
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:  # it steers a strength: there must be one to start from
        main(["train", "--sparsity-target", "0.5", "--save", str(tmp_path / "x"), "--dataset",
              "synthetic", "--cpu"])
    assert e.value.code == 2 and "--sparsity 1e-4" in capsys.readouterr().err


@pytest.mark.slow
def test_prune_sweep_and_pipeline_take_budgets(tmp_path, capsys):
    model = models.build("vgg", cfg=[16, "M", 32, "M", 64, 64, "M", 64, 64, "M", 64, 64])
    sparsity_shaped(model)
    slimming.save_checkpoint(slimming.checkpoint_dict(model, acc=50.0), tmp_path / "m.pth")
    assert main(["prune", "--checkpoint", str(tmp_path / "m.pth"), "--target-flops", "0.5", "--round-to", "8",
                 "--save", str(tmp_path / "p"), "--cpu"]) == 0
    out = capsys.readouterr().out
    assert "FLOPs budget" in out and "achieved" in out and "compensation:" in out
    pruned = torch.load(tmp_path / "p" / "pruned.pth", weights_only=True)
    assert pruned["budget"]["achieved"] <= pruned["budget"]["target"]
    assert main(["sweep", "--checkpoint", str(tmp_path / "m.pth"), "--target-params", "0.3,0.6",
                 "--save", str(tmp_path / "s"), "--dataset", "synthetic", "--cpu"]) == 0
    rows = json.loads((tmp_path / "s" / "sweep.json").read_text())
    assert [r.get("target") for r in rows] == [None, 0.3, 0.6]
    assert all(r["params_kept"] <= r["target"] for r in rows[1:])
    root = tmp_path / "pipe"
    assert main(["pipeline", "--cfg", "8,M,16,M,16,M,16,M,16", "--epochs", "1", "--finetune-epochs", "1",
                 "--sparsity", "1e-3", "--target-flops", "0.5", "--iterations", "2", "--repeats", "0",
                 "--dataset", "synthetic", "--cpu", "--batch-size", "256", "--save", str(root)]) == 0
    assert (root / "iter1" / "finetuned" / "last.pth").exists() and (root / "finetuned" / "last.pth").exists()
    final = torch.load(root / "pruned" / "pruned.pth", weights_only=True)["budget"]
    sparse = slimming.load_model(root / "sparse" / "best.pth")
    assert final["achieved"] <= 0.5 * count_flops(sparse)


def test_the_channels_last_note():
    assert channels_last_note({"latency_ms": {1: 1.0, 64: 10.0},
                               "latency_ms_channels_last": {1: 1.0, 64: 5.0}}).startswith(
        "channels-last runs this network faster here (2.00x at batch 64)")
    assert channels_last_note({"latency_ms": {64: 10.0}, "latency_ms_channels_last": {64: 10.0}}) is None


def test_measuring_latency_leaves_the_model_trainable():
    from slimming.measure.stats import model_stats

    model = models.build("vgg", cfg=SMALL_VGG)
    model_stats(model, repeats=1)
    model.train()
    model(torch.randn(2, 3, 32, 32)).sum().backward()  # no inference tensors among the weights
    assert all(p.is_contiguous() for p in model.parameters())


def test_a_constant_input_folds_without_the_convolution_and_the_same():
    """Where each cut channel is one value over the whole map (its beta's activation), the fold
    is the convolution's mean output, computed from each tap's share of positions inside the
    image instead of running it: the same as the convolution's, over random kernels, strides,
    paddings, dilations and map sizes; a map that varies is left to the convolution."""
    from slimming.pruning.repair import _constant_conv_mean
    rng, g = random.Random(0), torch.Generator().manual_seed(0)  # not torch's global generator:
    for _ in range(200):  # another test's draws before it once left a cut of no channel
        conv = nn.Conv2d(6, 4, (rng.choice([1, 3, 5]), rng.choice([1, 3])), stride=(rng.choice([1, 2, 3]), 2),
                         padding=(rng.choice([0, 1, 2]), 1), dilation=(rng.choice([1, 2]), 1))
        size = (2, 6, rng.randint(9, 20), rng.randint(5, 20))
        xs = torch.randn(2, 6, 1, 1, generator=g).expand(size).contiguous()
        w, cut = conv.weight.detach(), torch.rand(6, generator=g) < 0.6
        cut[rng.randrange(6)] = True  # a layer reading cut channels reads at least one
        want = nn.functional.conv2d(xs[:, cut], w[:, cut], None, conv.stride, conv.padding,
                                    conv.dilation).mean((2, 3))
        assert torch.allclose(_constant_conv_mean(conv, xs[:, cut], w, cut), want, rtol=1e-5, atol=1e-6)
    assert _constant_conv_mean(conv, torch.randn(2, int(cut.sum()), 9, 9), w, cut) is None
