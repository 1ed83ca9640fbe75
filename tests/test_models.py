import pytest
import torch
from torch import nn

from slimming import count_params, models
from slimming.models.vgg import DEFAULT_CFGS


@pytest.mark.parametrize("depth", sorted(DEFAULT_CFGS))
def test_vgg_depths_build_and_run(depth):
    model = models.build("vgg", depth=depth, num_classes=7, empty=True)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) + 3 == depth  # named after ImageNet VGG: convs + its three linear layers
    assert model.cfg == DEFAULT_CFGS[depth]
    assert model.classifier.out_features == 7


def test_vgg19_parameter_count_matches_paper():
    # the paper's Table 1: 20.04M parameters for VGG-19 on CIFAR-10
    assert round(count_params(models.build("vgg", depth=19, empty=True)) / 1e6, 2) == 20.04


def test_vgg_gammas_start_at_half_and_output_shape(tiny_vgg):
    bns = [m for m in tiny_vgg.modules() if isinstance(m, nn.BatchNorm2d)]
    assert all(torch.all(bn.weight == 0.5) for bn in bns)
    assert tiny_vgg(torch.randn(3, 3, 32, 32)).shape == (3, 10)


def test_nin_layout():
    model = models.build("nin", num_classes=10)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert [c.kernel_size[0] for c in convs] == [5, 1, 1, 5, 1, 1, 3, 1, 1]
    assert [c.out_channels for c in convs] == [192, 160, 96, 192, 192, 192, 192, 192, 10]
    assert all(c.bias is not None for c in convs)
    assert len(model.prunable_bns()) == 8  # the last block's BN (num_classes wide) is kept whole
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def test_paper_vgg_state_dict_layout_loads():
    """The paper's PyTorch VGG names its weights feature.N.* and classifier.*: they load as is."""
    cfg = [8, "M", 16, "M", 16, "M", 16, "M", 16]
    keys = []
    i = 0
    for v in cfg:
        if v == "M":
            i += 1
            continue
        keys += [f"feature.{i}.weight"] + [f"feature.{i + 1}.{k}" for k in
                                           ("weight", "bias", "running_mean", "running_var",
                                            "num_batches_tracked")]
        i += 3
    keys += ["classifier.weight", "classifier.bias"]
    model = models.build("vgg", cfg=cfg)
    assert list(model.state_dict()) == keys
    paper = {k: torch.rand_like(v) + 0.1 if v.dtype.is_floating_point else v
             for k, v in model.state_dict().items()}
    fresh = models.build("vgg", cfg=cfg)
    fresh.load_state_dict(paper)
    assert torch.equal(fresh.feature[0].weight, paper["feature.0.weight"])
    assert torch.isfinite(fresh.eval()(torch.randn(2, 3, 32, 32))).all()


@pytest.mark.parametrize("arch,cfg,options,match", [
    ("resnet", None, {}, "unknown arch"),
    ("vgg", None, {"depth": 12}, "depth"),
    ("vgg", [8, "M", 0], {}, "positive"),
    ("vgg", [8, "M"], {}, "end with"),
    ("nin", [8, 8], {}, "eight"),
    ("nin", None, {"depth": 19}, "no option depth"),
])
def test_build_refuses_bad_input(arch, cfg, options, match):
    with pytest.raises(ValueError, match=match):
        models.build(arch, cfg=cfg, **options)


def test_empty_build_skips_initialisation():
    model = models.build("vgg", depth=19, empty=True)
    assert all(p.is_meta for p in model.parameters())
