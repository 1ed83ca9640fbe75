"""Budgets (``target_flops``, ``target_params``) on a YOLO11-shaped detector: a backbone of
conv+BN+SiLU and C2f blocks, a C2PSA block (attention whose ``view`` reads the number of heads,
the key and head widths as fixed sizes, a depthwise positional conv on v) and a detection head
kept by ``ignore=``.

A budget searches over candidate cuts and measures each one (its FLOPs: a forward); some of
them do not run as built (the attention cut to widths its view cannot take), which ``percent``
meets only in the check, that cuts again with the sizes kept. The contract, as for ``percent``:
the result is exact (checked, at or under the budget, equal to the original with the cut
channels zeroed) or a one-line SlimmingError, never a raw error; the original is untouched.
This detector, which ``percent`` prunes exactly, must be pruned exactly to every budget."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import rel_diff, zeroed
from test_trace import C2f, cbr, flat
from test_trace_hostile import Attention, PSABlock, cb
from torch import nn

import slimming
from slimming.errors import SlimmingError
from slimming.measure.stats import count_flops, count_params
from slimming.pruning.graph import GraphError
from slimming.pruning.surgery import WidthChange

pytestmark = pytest.mark.usefixtures("one_thread")  # many tiny convolutions: one thread is faster


class YoloAttention(Attention):
    """``Attention`` with ultralytics' own names (``num_heads``, ``key_dim``, ``head_dim``,
    ``attn_ratio``) and forward, as YOLO11's C2PSA builds it."""

    def __init__(self, dim: int, num_heads: int = 2, attn_ratio: float = 0.5):
        nn.Module.__init__(self)
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.key_dim = int(self.head_dim * attn_ratio)
        self.scale = self.key_dim ** -0.5
        self.qkv = cb(dim, dim + 2 * self.key_dim * num_heads)
        self.proj, self.pe = cb(dim, dim), cb(dim, dim, 3, g=dim)

    def forward(self, x):
        B, C, H, W = x.shape
        N = H * W
        q, k, v = self.qkv(x).view(B, self.num_heads, self.key_dim * 2 + self.head_dim, N).split(
            [self.key_dim, self.key_dim, self.head_dim], dim=2)
        attn = ((q.transpose(-2, -1) @ k) * self.scale).softmax(dim=-1)
        x = (v @ attn.transpose(-2, -1)).view(B, C, H, W) + self.pe(v.reshape(B, C, H, W))
        return self.proj(x)


class C2PSA(nn.Module):
    """YOLO11's C2PSA block: cv1, split in halves, PSA blocks on one, concatenation, cv2."""

    def __init__(self, c1: int, n: int = 1, attention: type = Attention):
        super().__init__()
        self.c = c1 // 2
        self.cv1, self.cv2 = cbr(c1, 2 * self.c, 1), cbr(2 * self.c, c1, 1)
        self.m = nn.Sequential(*(PSABlock(self.c) for _ in range(n)))
        for block in self.m:
            block.attn = attention(self.c)

    def forward(self, x):
        a, b = self.cv1(x).split((self.c, self.c), 1)
        return self.cv2(torch.cat((a, self.m(b)), 1))


class Detect(nn.Module):
    """A decoupled head at two strides: a box and a class branch per feature map."""

    def __init__(self, chs: tuple[int, ...], nc: int = 3):
        super().__init__()
        self.box = nn.ModuleList(nn.Sequential(cbr(c, 16), nn.Conv2d(16, 16, 1)) for c in chs)
        self.cls = nn.ModuleList(nn.Sequential(cbr(c, 16), nn.Conv2d(16, nc, 1)) for c in chs)

    def forward(self, feats):
        return [torch.cat((box(f), cls(f)), 1) for box, cls, f in zip(self.box, self.cls, feats)]


class Yolo11(nn.Module):
    def __init__(self, attention: type = Attention):
        super().__init__()
        self.b0, self.b1 = cbr(3, 16, 3, 2), cbr(16, 32, 3, 2)
        self.c2, self.b3, self.c4 = C2f(32, 32, 1), cbr(32, 64, 3, 2), C2f(64, 64, 1)
        self.psa = C2PSA(64, 1, attention)
        self.head = Detect((32, 64))

    def forward(self, x):
        p3 = self.c2(self.b1(self.b0(x)))
        return self.head([p3, self.psa(self.c4(self.b3(p3)))])


def detector(attention: type, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    model = Yolo11(attention).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):  # many near zero, as sparsity training leaves them
                m.weight.copy_(torch.rand(m.num_features, generator=g) ** 3)
                m.bias.copy_(torch.randn(m.num_features, generator=g) * 0.1)
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.2)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
    return model


@pytest.mark.parametrize("budget", [{"target_flops": 0.6}, {"target_flops": 0.75}, {"target_params": 0.6}])
@pytest.mark.parametrize("attention", [Attention, YoloAttention])
@pytest.mark.parametrize("seed", [0, 2])
@pytest.mark.slow
def test_a_budget_on_a_c2psa_detector_is_met_exactly(budget, attention, seed):
    model = detector(attention, seed)
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(seed))
    batch = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(7))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # sizes kept, little sparsity: said, and fine here
            result = slimming.prune(model, ignore="head", example_inputs=x, compensate=False, **budget)
    except SlimmingError as e:  # the contract allows a one-line refusal, but percent prunes this
        # network exactly (the attention's sizes kept), and so must a budget
        pytest.fail(f"refused ({type(e).__name__}): {e}")
    else:
        got = result.budget
        assert got.achieved <= got.target < got.full
        pruned = result.model
        returned = count_flops(pruned, (3, 64, 64)) if "target_flops" in budget else count_params(pruned)
        assert got.achieved == returned  # measured as it is returned
        assert result.verified is not None and result.verified < 1e-3
        with torch.no_grad():
            a, b = flat(result.model(batch)), flat(zeroed(model, result.masks)(batch))
        assert a.shape == b.shape and rel_diff(a, b) < 1e-4
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("budget", [{"target_flops": 0.6}, {"target_params": 0.6}])
@pytest.mark.parametrize("attention", [Attention, YoloAttention])
@pytest.mark.slow
def test_an_unchecked_budget_runs_and_cuts_what_the_checked_one_cuts(budget, attention):
    """verify=False: a candidate that does not run is not returned (it fell back as the checked
    call does), and the cut is the checked call's."""
    model = detector(attention, 0)
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = [slimming.prune(model, ignore="head", example_inputs=x, compensate=False, verify=v,
                                  **budget) for v in (True, False)]
    checked, unchecked = results
    assert unchecked.verified is None and unchecked.budget.achieved == checked.budget.achieved
    assert all(torch.equal(checked.masks[k], unchecked.masks[k]) for k in checked.masks)
    with torch.no_grad():
        assert unchecked.model.eval()(torch.randn(2, 3, 64, 64)) is not None


class _Candidate:
    """What ``measured`` reads of a PruneResult: the model and the integer widths set."""

    def __init__(self, model, widths):
        self.model, self.widths = model, widths


class Reads(nn.Module):
    """A forward that reads ``c`` as a fixed size of its input."""

    def __init__(self, c: int):
        super().__init__()
        self.c, self.conv = c, nn.Conv2d(3, 4, 1)

    def forward(self, x):
        return self.conv(x.view(1, self.c, 2, 2))


def test_measured_runs_a_candidate_with_its_unsure_widths_put_back_and_refuses_one_that_never_runs():
    from slimming.pruning.budget import measured  # here: the module's other test runs without it

    ran = _Candidate(Reads(2), [WidthChange("", "c", 3, 2, False)])  # fails with c=2; runs with c=3
    assert measured(ran, lambda m: count_flops(m, (3, 2, 2))) == count_flops(Reads(3), (3, 2, 2))
    assert ran.model.c == 2  # left as built: the check decides which stay put back
    broken = _Candidate(Reads(2), [WidthChange("", "c", 5, 2, False)])
    with pytest.raises(GraphError, match="does not run") as e:
        measured(broken, lambda m: count_flops(m, (3, 2, 2)))
    assert "\n" not in str(e.value) and broken.model.c == 2


@pytest.mark.parametrize("attention", [Attention, YoloAttention])
@pytest.mark.parametrize("asked", [0.2, 0.5, 0.7])
@pytest.mark.slow
def test_a_latency_budget_on_a_c2psa_detector_is_exact(attention, asked):
    """The latency budget times its candidates the same way (``measured``): exact, checked, or
    (0.2: the attention cut that far does not run, and kept whole, its sizes cost more than
    the budget) one line; never the attention's raw error."""
    from test_latency import StepLatency, cost

    from slimming.pruning.speed import TOLERANCE

    model = detector(attention, 1)
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            result = slimming.prune(model, ignore="head", example_inputs=x, compensate=False,
                                    target_latency=asked, latency_model=StepLatency())
        except SlimmingError as e:
            assert asked == 0.2 and "cannot be met" in str(e) and "\n" not in str(e)
            assert all(torch.equal(before[k], model.state_dict()[k]) for k in before)
            return
    assert result.budget.ratio == pytest.approx(cost(result.model, x) / cost(model, x))
    assert result.budget.ratio <= asked * (1 + TOLERANCE)
    assert result.verified is not None and result.verified < 1e-3
    with torch.no_grad():
        a, b = flat(result.model(x)), flat(zeroed(model, result.masks)(x))
    assert rel_diff(a, b) < 1e-4
    assert all(torch.equal(before[k], model.state_dict()[k]) for k in before)
