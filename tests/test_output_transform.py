"""``output_transform``: a detector whose head also passes its inputs out (Ultralytics' end-to-end
heads return ``(y, {"boxes", "scores", "feats": [the head's inputs]})`` in eval mode) keeps
those inputs whole by slimming's promise, as every output is; ``output_transform=lambda out:
out[0]`` says which outputs must keep their values and widths, and the features are cut where
their producers are. The detector here is written the way those heads are written; no AGPL code
is imported."""

import pytest
import torch
from conftest import rel_diff, sparsity_shaped, zeroed
from torch import nn

import slimming
from slimming.pruning.ops import leaves


class Conv(nn.Module):
    """Convolution, BatchNorm, SiLU: the detectors' building block."""

    def __init__(self, c1: int, c2: int, s: int = 1):
        super().__init__()
        self.conv, self.bn, self.act = nn.Conv2d(c1, c2, 3, s, 1, bias=False), nn.BatchNorm2d(c2), nn.SiLU()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class PassingDetect(nn.Module):
    """A decoupled head per scale; training: the raw maps; eval: the predictions and a dict of
    boxes, scores and the features it was given (what an end-to-end head returns)."""

    def __init__(self, chs: tuple[int, ...], nc: int = 3, width: int = 16):
        super().__init__()
        self.box = nn.ModuleList(nn.Sequential(Conv(c, width), nn.Conv2d(width, 4, 1)) for c in chs)
        self.cls = nn.ModuleList(nn.Sequential(Conv(c, width), nn.Conv2d(width, nc, 1)) for c in chs)

    def forward(self, xs: list[torch.Tensor]):
        maps = [torch.cat([b(x), c(x)], 1) for b, c, x in zip(self.box, self.cls, xs)]
        if self.training:
            return maps
        y = torch.cat([m.flatten(2) for m in maps], 2)
        return y, {"boxes": y[:, :4], "scores": y[:, 4:].sigmoid(), "feats": xs}


class PassingYOLO(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem, self.down1, self.c1 = Conv(3, 16, 2), Conv(16, 32, 2), Conv(32, 32)
        self.down2, self.c2 = Conv(32, 64, 2), Conv(64, 64)
        self.head = PassingDetect((32, 64))

    def forward(self, x):
        p3 = self.c1(self.down1(self.stem(x)))
        return self.head([p3, self.c2(self.down2(p3))])


def params(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_head_that_passes_its_inputs_out_is_cut_through_them_with_output_transform(seed):
    torch.manual_seed(seed)
    model = PassingYOLO().eval()
    sparsity_shaped(model, seed)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(seed))
    options = dict(percent=0.4, example_inputs=x[:1], ignore=("head",), compensate=False)
    whole = slimming.prune(model, **options)
    picked = slimming.prune(model, output_transform=lambda out: out[0], **options)
    # without it the features are outputs: kept, and with them what makes them
    assert [f.shape[1] for f in whole.model(x)[1]["feats"]] == [32, 64]
    assert whole.masks["c1.bn"].all() and whole.masks["c2.bn"].all()
    feats = picked.model(x)[1]["feats"]
    assert feats[0].shape[1] < 32 or feats[1].shape[1] < 64
    assert params(picked.model) < params(whole.model)
    with torch.no_grad():  # the predictions are exact; the head's own channels all kept
        assert rel_diff(picked.model(x)[0], zeroed(model, picked.masks)(x)[0]) < 1e-5
    assert picked.verified < 1e-5
    for name, masks in picked.layers.items():  # the head reads cut features, makes all it made
        assert not name.startswith("head.") or all(m.all() for side, m in masks.items() if side != "in"), name
    compensated = slimming.prune(model, output_transform=lambda out: out[0], percent=0.4,
                                 example_inputs=x[:1], ignore=("head",))  # the default: compensated
    assert compensated.compensation["layers"] >= 1 and compensated.model(x)[0].shape == model(x)[0].shape


def test_an_output_transform_that_is_no_function_or_fails_is_one_line_and_changes_nothing():
    model = PassingYOLO().eval()
    sparsity_shaped(model, 0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.zeros(1, 3, 32, 32)
    with pytest.raises(slimming.SlimmingError, match="output_transform takes a function") as e:
        slimming.prune(model, percent=0.4, example_inputs=x, output_transform=0)
    assert "\n" not in str(e.value)
    with pytest.raises(slimming.SlimmingError, match="output_transform failed on the model's output") as e:
        slimming.prune(model, percent=0.4, example_inputs=x, output_transform=lambda out: out["y"])
    assert "\n" not in str(e.value)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def forgot_its_return(out):
    out[0].sum()


@pytest.mark.parametrize("transform", [forgot_its_return, lambda out: 3, lambda out: "y",
                                       lambda out: torch.zeros(1), lambda out: torch.randn(1, 7, 8),
                                       lambda out: out[0] * 2, lambda out: (None, {"n": 1})],
                         ids=["None", "a number", "a string", "a constant", "a fresh tensor",
                              "computed from the output", "no tensor"])
@pytest.mark.parametrize("net", ["detector", "backbone"])
def test_an_output_transform_returning_nothing_of_the_output_is_refused_and_changes_nothing(net, transform):
    """Nothing of the output pinned, the network's own output would lose channels and the check
    pass (a backbone's (1, 8, 16, 16) came back (1, 4, 16, 16)): refused in one line instead, the
    model's outputs bit for bit as before."""
    model = (PassingYOLO() if net == "detector" else nn.Sequential(Conv(3, 8), Conv(8, 8))).eval()
    sparsity_shaped(model, 0)
    x = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        before = model(x)
    with pytest.raises(slimming.SlimmingError, match="nothing of the model's output") as e:
        slimming.prune(model, percent=0.4, example_inputs=x, output_transform=transform)
    assert "\n" not in str(e.value) and e.value.params == ("output_transform",)
    with torch.no_grad():
        after = model(x)
    assert all(torch.equal(a, b) for a, b in zip(leaves(after), leaves(before)))
