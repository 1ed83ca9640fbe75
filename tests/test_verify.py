"""What keeps a pruned network honest beyond the trace's rules: ``verify`` (the pruned network
checked against the zeroed original in the same call), every module's train/eval flag left as
it was, compensation over any output structure, widths kept in integer attributes, layers of
your own (``register_layer``), and pruned networks of these layers saved and loaded back."""

import warnings

import pytest
import torch
import torch.nn.functional as F
from conftest import rel_diff, sparsity_shaped, zeroed
from test_trace import cbr
from test_trace_hostile import PATTERNS, example, plain, run
from torch import nn

import slimming
from slimming.layers import rules as layers
from slimming.pruning import ops
from slimming.pruning.graph import GraphError

torchvision = pytest.importorskip("torchvision")


def assert_exact(model: nn.Module, result, x: torch.Tensor) -> None:
    """The pruned network equals ``model`` with the cut channels zeroed, on ``x``."""
    with torch.no_grad():
        assert rel_diff(result.model(x), zeroed(model, result.masks)(x)) < 1e-5


class Gate(nn.Module):
    """sigmoid(BN output) read by a convolution: sigmoid(0) = 0.5, so the cut channels are not
    zero for the reader, and the trace must keep them."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.fc = cbr(3, 16)[:2], cbr(16, 8), nn.Linear(8, 3)

    def forward(self, x):
        return self.fc(self.b(torch.sigmoid(self.a(x))).mean((2, 3)))


def test_verify_refuses_a_wrong_cut_names_the_module_and_leaves_the_model(monkeypatch):
    model = Gate().eval()
    sparsity_shaped(model, 0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    exact = slimming.prune(model, percent=0.5, example_inputs=torch.zeros(1, 3, 16, 16))
    assert exact.verified is not None and exact.verified < 1e-5
    # a deliberately wrong rule: sigmoid said to keep zeros, so the reader's channels get cut
    monkeypatch.setattr(ops, "ELEMENTWISE", ops.ELEMENTWISE - {"sigmoid"})
    monkeypatch.setattr(ops, "ZERO_OPS", ops.ZERO_OPS | {"sigmoid"})
    with pytest.raises(GraphError) as e:
        slimming.prune(model, percent=0.5, example_inputs=torch.zeros(1, 3, 16, 16))
    message = str(e.value)
    assert "differs from the original" in message and "first in b.0" in message and "\n" not in message
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    unchecked = slimming.prune(model, percent=0.5, example_inputs=torch.zeros(1, 3, 16, 16),
                               verify=False, compensate=False)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():  # what verify kept from the user: a network that is not the promise
        assert rel_diff(unchecked.model(x), zeroed(model, unchecked.masks)(x)) > 1e-3
    assert unchecked.verified is None


def test_every_modules_train_or_eval_flag_is_left_as_it_was():
    model = torchvision.models.resnet18(num_classes=10).train()
    model.layer2[0].bn1.eval()  # a BatchNorm frozen in eval inside a training model
    sparsity_shaped(model, 1)
    flags = {n: m.training for n, m in model.named_modules()}
    for how in ({"percent": 0.5}, {"target_flops": 0.6}):
        result = slimming.prune(model, example_inputs=torch.zeros(1, 3, 32, 32), **how)
        assert {n: m.training for n, m in model.named_modules()} == flags, how
        assert {n: m.training for n, m in result.model.named_modules()} == flags, how


class TupleOut(nn.Module):
    """A YOLO-style eval output: (predictions, {"features": [...]})."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = cbr(3, 16), cbr(16, 16, 1), nn.Conv2d(16, 6, 1)

    def forward(self, x):
        f = self.b(self.a(x))
        return self.c(f).flatten(2), {"features": [f.mean((2, 3))]}


def test_compensation_takes_any_output_structure():
    model = TupleOut().eval()
    sparsity_shaped(model, 3)
    result = slimming.prune(model, percent=0.5, example_inputs=torch.zeros(1, 3, 16, 16))
    assert result.compensation["layers"] >= 1
    out = result.model(torch.randn(1, 3, 16, 16))
    assert isinstance(out, tuple) and isinstance(out[1], dict)


def test_widths_kept_in_integer_attributes_follow_the_cut():
    timm = pytest.importorskip("timm")
    model = timm.create_model("resnet18", pretrained=False, num_classes=5).eval()
    sparsity_shaped(model, 2)
    result = slimming.prune(model, percent=0.6, example_inputs=torch.zeros(1, 3, 32, 32))
    assert result.model.num_features == result.model.fc.in_features < model.num_features
    assert ("", "num_features", model.num_features, result.model.num_features, False) in result.widths


class Reads(nn.Module):
    """timm's CspStage keeps ``expand_chs`` and splits by half of it: a width the forward reads
    as a fixed size, which matches the concatenation the cut narrows."""

    def __init__(self):
        super().__init__()
        self.chs = 32
        self.a, self.b, self.out = cbr(3, 32), cbr(16, 16), cbr(32, 8)

    def forward(self, x):
        p, q = self.a(x).split(self.chs // 2, 1)
        return self.out(torch.cat([p, self.b(q)], 1))


def test_a_width_read_as_a_fixed_size_is_left_and_the_cut_stays_exact():
    model = Reads().eval()
    sparsity_shaped(model, 0)
    with pytest.warns(UserWarning, match=r"1 integer attribute\(s\) left as they were \(the forward reads "
                      r"them as fixed sizes\): chs"):
        result = slimming.prune(model, percent=0.5, example_inputs=torch.zeros(1, 3, 16, 16),
                                compensate=False)
    assert result.model.chs == 32 and result.model.b[0].out_channels < 16 and not result.widths
    assert_exact(model, result, torch.randn(2, 3, 16, 16))


class AsNumber(nn.Module):
    """A width the forward reads as a shape (``reshape(B, self.c, -1)``, which the cut must set)
    and, with ``branch``, as a number too (``if x.shape[-1] < self.c``: hostile round 5): at the
    example's 8x8 both branches agree, at 6x6 they do not once ``c`` is lowered."""

    def __init__(self, branch: bool):
        super().__init__()
        self.branch, self.c = branch, 8
        self.conv, self.bn, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.Linear(8, 3)

    def forward(self, x):
        y = self.bn(self.conv(x)).reshape(x.shape[0], self.c, -1)
        if self.branch and x.shape[-1] < self.c:
            y = y * 2
        return self.fc(y.mean(-1))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_width_also_read_as_a_number_is_checked_at_a_second_input_size(seed):
    """The check runs at a second input size (three quarters of the example's) where the cut
    set integer widths: the width read as a shape alone is set and exact at every size; read
    as a number too, the cut is refused in one line and the model left as it was."""
    gen = torch.Generator().manual_seed(seed)
    for branch in (False, True):
        torch.manual_seed(seed)
        model = AsNumber(branch).eval()
        with torch.no_grad():
            model.bn.weight.copy_(torch.rand(8, generator=gen) + 0.5)
            model.bn.weight[torch.randperm(8, generator=gen)[:4]] = 1e-4
        before = {k: v.clone() for k, v in model.state_dict().items()}
        x = torch.zeros(1, 3, 8, 8)
        if branch:
            with pytest.raises(GraphError) as e:
                slimming.prune(model, percent=0.5, example_inputs=x, compensate=False)
            assert "\n" not in str(e.value) and model.c == 8
            assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
            continue
        result = slimming.prune(model, percent=0.5, example_inputs=x, compensate=False)
        assert result.model.c == 4 == result.model.bn.num_features
        for size in (8, 6, 4, 12):
            assert_exact(model, result, torch.randn(2, 3, size, size, generator=gen))


class Deform(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = cbr(3, 16)
        self.offsets = nn.Conv2d(16, 18, 3, padding=1)
        self.dc = torchvision.ops.DeformConv2d(16, 24, 3, padding=1)
        self.bn, self.out = nn.BatchNorm2d(24), nn.Conv2d(24, 5, 1)

    def forward(self, x):
        y = self.a(x)
        return self.out(F.relu(self.bn(self.dc(y, self.offsets(y)))))


@pytest.fixture
def deform_rule():
    rule = slimming.LayerRule(reads={"weight": 1}, makes={"weight": 0, "bias": 0},
                              widths={"in_channels": "in", "out_channels": "out"})
    with slimming.register_layer(torchvision.ops.DeformConv2d, rule) as name:
        yield name


def test_a_layer_of_your_own_is_followed_by_its_rule(deform_rule, tmp_path):
    model = Deform().eval()
    sparsity_shaped(model, 5)
    x = torch.randn(2, 3, 16, 16)
    result = slimming.prune(model, percent=0.5, example_inputs=x[:1], compensate=False)
    dc = result.model.dc
    assert dc.weight.shape == (dc.out_channels, dc.in_channels, 3, 3)
    assert dc.in_channels < 16 and dc.out_channels < 24
    assert result.model.offsets.in_channels == dc.in_channels  # the offsets' producer reads the same
    assert result.model.offsets.out_channels == 18  # offsets are positions, not channels: kept
    assert_exact(model, result, x)
    slimming.save_pruned(result.model, tmp_path / "deform.pth")
    again = slimming.load_pruned(tmp_path / "deform.pth", Deform()).eval()
    with torch.no_grad():
        assert torch.equal(again(x), result.model(x))


def test_a_layer_rule_must_say_what_it_cuts():
    with pytest.raises(slimming.SlimmingError, match="makes channels"):
        slimming.register_layer(nn.Identity, slimming.LayerRule())
    with pytest.raises(slimming.SlimmingError, match="nn.Module subclass"):
        slimming.register_layer(int, slimming.LayerRule(carries={"weight": 0}))


@pytest.mark.parametrize("name", ["LayerScale", "BlurPool", "CustomConv", "Video3d", "PooledBN1d",
                                  "DotData"])
def test_pruned_networks_of_these_layers_load_into_a_fresh_instance(name, tmp_path):
    torch.manual_seed(0)
    model = PATTERNS[name]().eval()
    sparsity_shaped(model, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = slimming.prune(model, percent=0.5, example_inputs=example(name))
    slimming.save_pruned(result.model, tmp_path / "p.pth")
    torch.manual_seed(1)
    again = slimming.load_pruned(tmp_path / "p.pth", PATTERNS[name]()).eval()
    x = example(name, batch=2, seed=4)
    with torch.no_grad():
        assert torch.equal(plain(run(again, x)), plain(run(result.model.eval(), x)))


def test_unchecked_only_the_widths_a_convolution_was_given_are_set():
    """verify=False: nothing vouches for a width matched by its value (CspStage's would break
    the forward: left, and named); the groups= a module gave its own depthwise convolution (a
    blur filter's ``self.channels``) must follow the channels, and does."""
    model = Reads().eval()
    sparsity_shaped(model, 0)
    with pytest.warns(UserWarning, match=r"left as they were \(verify=False: only the check vouches "
                      r"for them\): chs"):
        result = slimming.prune(model, percent=0.5, example_inputs=torch.zeros(1, 3, 16, 16),
                                verify=False, compensate=False)
    assert result.model.chs == 32 and not result.widths
    timm = pytest.importorskip("timm")
    blur = timm.create_model("resnetblur18", pretrained=False, num_classes=4).eval()
    sparsity_shaped(blur, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = slimming.prune(blur, percent=0.5, example_inputs=torch.zeros(1, 3, 32, 32), verify=False,
                                compensate=False)
    pool = next(m for m in result.model.modules() if type(m).__name__ == "BlurPool2d")
    assert pool.channels == pool.filt.shape[0] < 64 and all(w[4] for w in result.widths)
    assert_exact(blur, result, torch.randn(2, 3, 32, 32))


class ZeroStart(nn.Module):
    """timm's MobileOne block sums its branches from ``out = 0``: 0 + x keeps x's zeros."""

    def __init__(self):
        super().__init__()
        self.stem, self.out = cbr(3, 16), cbr(16, 8)
        self.branches = nn.ModuleList(cbr(16, 16)[:2] for _ in range(2))

    def forward(self, x):
        x = self.stem(x)
        y = 0
        for b in self.branches:
            y += b(x)
        return self.out(F.relu(y))


def test_a_sum_started_at_zero_is_cut_like_any_sum():
    model = ZeroStart().eval()
    sparsity_shaped(model, 3)
    result = slimming.prune(model, percent=0.5, example_inputs=torch.zeros(1, 3, 16, 16), compensate=False)
    assert not result.masks["branches.0.1"].all()
    assert torch.equal(result.masks["branches.0.1"], result.masks["branches.1.1"])  # tied by the sum


class ZeroBias(nn.Module):
    """HGNetV2's LearnableAffineBlock: ``scale * x + bias`` with one-value parameters. A bias
    at zero (its init) keeps the cut channels at zero; a trained one does not, and keeps them."""

    def __init__(self):
        super().__init__()
        self.a, self.b = cbr(3, 16), cbr(16, 8)
        self.scale, self.bias = nn.Parameter(torch.ones(1)), nn.Parameter(torch.zeros(1))

    def forward(self, x):
        return self.b(self.scale * self.a(x) + self.bias)


def test_adding_a_zero_parameter_keeps_zeros_and_a_nonzero_one_does_not():
    model = ZeroBias().eval()
    sparsity_shaped(model, 4)
    x = torch.zeros(1, 3, 16, 16)
    assert not slimming.prune(model, percent=0.5, example_inputs=x).masks["a.1"].all()
    with torch.no_grad():
        model.bias.fill_(0.1)
    # a.1's channels, the bias added, reach b.0 as constants: kept; nothing else can be cut
    with pytest.raises(GraphError, match="b.0 reads it before any BatchNorm"):
        slimming.prune(model, percent=0.5, example_inputs=x, compensate=False)


class BatchNormAct(nn.BatchNorm2d):
    """timm's BatchNormAct2d: a BatchNorm whose own children apply dropout (an identity in
    eval) and an in-place activation to its output, which it returns."""

    def __init__(self, channels: int):
        super().__init__(channels)
        self.drop, self.act = nn.Identity(), nn.ReLU(inplace=True)

    def forward(self, x):
        return self.act(self.drop(super().forward(x)))


def test_the_check_sees_each_module_output_as_it_was_before_an_in_place_activation():
    """The check fingerprints every module's output when it returns: the identity's output is
    the tensor the activation then changes in place, and the BatchNorm's is that tensor after;
    a fingerprint kept from before the change would fail this exact cut."""
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), BatchNormAct(16), nn.Conv2d(16, 8, 3, padding=1),
                          BatchNormAct(8), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3)).eval()
    sparsity_shaped(model, 0)
    x = torch.zeros(1, 3, 16, 16)
    result = slimming.prune(model, percent=0.4, example_inputs=x, compensate=False)
    assert result.model[1].num_features < 16 and result.verified < 1e-5
    assert_exact(model, result, torch.randn(2, 3, 16, 16))


def test_a_registration_is_undone_by_remove_or_at_the_end_of_a_with_block():
    """register_layer changes a process-wide table: its answer (the kind's name, as before)
    undoes it, a rule it replaced comes back, and a with block keeps it to the block."""
    before = dict(layers.RULES), dict(layers.MODULE_RULES)
    rule = slimming.LayerRule(reads={"weight": 1}, makes={"weight": 0, "bias": 0},
                              widths={"in_channels": "in", "out_channels": "out"})
    model = Deform().eval()
    sparsity_shaped(model, 5)
    x = torch.randn(1, 3, 16, 16)
    with slimming.register_layer(torchvision.ops.DeformConv2d, rule) as name:
        assert name == "DeformConv2d" and layers.RULES[name] is rule
        small = slimming.prune(model, percent=0.5, example_inputs=x, compensate=False).model
        assert small.dc.in_channels < 16
    assert (dict(layers.RULES), dict(layers.MODULE_RULES)) == before
    # unregistered, DeformConv2d is an op the trace does not know: what it reads is kept, here all
    with pytest.raises(slimming.SlimmingError, match="deform_conv2d .an op it does not know"):
        slimming.prune(model, percent=0.5, example_inputs=x, compensate=False)
    first = slimming.register_layer(torchvision.ops.DeformConv2d, rule)
    other = slimming.LayerRule(reads={"weight": 1}, makes={"weight": 0})
    second = slimming.register_layer(torchvision.ops.DeformConv2d, other)
    second.remove()
    assert layers.RULES[first] is rule  # the rule it replaced is back
    first.remove()
    first.remove()  # twice: nothing more
    assert (dict(layers.RULES), dict(layers.MODULE_RULES)) == before


@torch.library.custom_op("slimming_tests::swish", mutates_args=())
def _swish(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x)


@_swish.register_fake
def _(x):
    return torch.empty_like(x)


class CustomOpNet(nn.Module):
    """A network calling a custom op of its own (torch.library), between a BatchNorm and the
    next convolution: the trace does not know it until register_op says what it is like."""

    def __init__(self):
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16))
        self.b = nn.Conv2d(16, 8, 1)

    def forward(self, x):
        return self.b(torch.ops.slimming_tests.swish(self.a(x)))


def test_an_op_of_your_own_is_followed_as_the_op_it_is_like():
    model = CustomOpNet().eval()
    sparsity_shaped(model, 3)
    x = torch.randn(2, 3, 8, 8)
    with pytest.raises(slimming.SlimmingError, match="swish .an op it does not know"):
        slimming.prune(model, percent=0.5, example_inputs=x[:1], compensate=False)  # kept: nothing to cut
    with slimming.register_op("swish", like="silu") as name:
        assert name == "swish"
        result = slimming.prune(model, percent=0.5, example_inputs=x[:1], compensate=False)
    assert result.model.b.in_channels == int(result.masks["a.1"].sum()) < 16
    assert_exact(model, result, x)
    with pytest.raises(slimming.SlimmingError, match="swish .an op it does not know"):
        slimming.prune(model, percent=0.5, example_inputs=x[:1], compensate=False)  # undone at the end
    with pytest.raises(slimming.SlimmingError, match="not an op the trace knows"):
        slimming.register_op("swish", like="no_such_op")
    with pytest.raises(slimming.SlimmingError, match="an op the trace does not know"):
        slimming.register_op("relu", like="silu")


def test_a_layer_of_your_own_is_known_by_its_call_as_the_built_in_ones_are():
    """A rule with ``calls`` is recognised the way convolutions and BatchNorms are: by the
    torch function called with one module's tensors (here torchvision's deformable convolution
    op, its weight at 1 and bias at 4); the offsets it also reads are kept. The cut is the one
    the whole-module registration gives, exact, and the registration undone after."""
    before = dict(layers.RULES), dict(layers.MODULE_RULES)
    widths = {"in_channels": "in", "out_channels": "out"}
    by_call = slimming.LayerRule(reads={"weight": 1}, makes={"weight": 0, "bias": 0}, widths=widths,
                                 calls=("deform_conv2d",), positions=(("weight", 1), ("bias", 4)))
    whole = slimming.LayerRule(reads={"weight": 1}, makes={"weight": 0, "bias": 0}, widths=widths)
    model = Deform().eval()
    sparsity_shaped(model, 5)
    x = torch.randn(2, 3, 16, 16)
    cuts = []
    for rule in (by_call, whole):
        with slimming.register_layer(torchvision.ops.DeformConv2d, rule):
            result = slimming.prune(model, percent=0.5, example_inputs=x[:1], compensate=False)
        assert result.model.dc.in_channels < 16 and result.model.offsets.out_channels == 18
        assert_exact(model, result, x)
        cuts.append({k: tuple(v.shape) for k, v in result.model.state_dict().items()})
    assert cuts[0] == cuts[1]
    assert (dict(layers.RULES), dict(layers.MODULE_RULES)) == before


class ValueBranch(nn.Module):
    """A branch on the input's values (hostile round 5): ``if x.mean() > 0.3`` the channels are
    reversed (``y.flip(1)``) before the next layer reads them. The check's normal noise (mean
    about 0) never takes it; images in [0, 1] (mean about 0.5) always do. ``how``: what the
    branch does: ``flip`` the channels, or ``scale`` them (a path with nothing to keep)."""

    def __init__(self, how: str = "flip"):
        super().__init__()
        self.how = how
        self.a, self.b, self.fc = cbr(3, 16), cbr(16, 16), nn.Linear(16, 5)

    def forward(self, x):
        y = self.a(x)
        if x.mean() > 0.3:
            y = y.flip(1) if self.how == "flip" else y * 2
        return self.fc(self.b(y).mean((2, 3)))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_branch_on_the_input_values_is_traced_and_checked_on_images_too(seed):
    """Before, the trace and the check saw only the noise's path: the cut paired ``b``'s
    columns with ``a``'s channels, and on real images (the flipped path) the pruned network was
    wrong. Now a forward that reads values of its input is traced and checked on images in
    [0, 1] too (``result.value_reads`` names where): exact on both kinds of input, the channels
    the flip reorders kept; a branch that only scales is cut as before."""
    for how in ("flip", "scale"):
        torch.manual_seed(seed)
        model = ValueBranch(how).eval()
        sparsity_shaped(model, seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = slimming.prune(model, percent=0.5, example_inputs=torch.randn(1, 3, 16, 16),
                                    compensate=False)
        assert result.value_reads == [""]  # the model's own forward
        gen = torch.Generator().manual_seed(seed)
        for x in (torch.randn(2, 3, 16, 16, generator=gen), torch.rand(2, 3, 16, 16, generator=gen)):
            assert_exact(model, result, x)
        assert result.masks["a.1"].all() == (how == "flip")  # what the flip reorders: kept
        assert not result.masks["b.1"].all()


class RawBranch(nn.Module):
    """A forward that takes another path on raw 0-255 images only (``x.amax() > 10``): one
    neither the check's noise nor its images in [0, 1] reach."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.conv2, self.bn2 = nn.Conv2d(16, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 2)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        if x.amax() > 10:  # the first four channels, by position: which ones the cut moves
            y = torch.cat([y[:, :4] * 2, y[:, 4:]], 1)
        return self.fc(torch.relu(self.bn2(self.conv2(y))).mean((2, 3)))


def test_check_inputs_make_the_check_compare_on_the_users_own_value_range():
    """Hostile round 6, low: a branch on a value range noise and [0, 1] images never reach is
    silently off on it; check_inputs (real batches) makes the check compare there too: the cut
    is then exact on them or refused in one line, the model untouched."""
    torch.manual_seed(0)
    model = RawBranch().eval()
    sparsity_shaped(model, 3)
    with torch.no_grad():
        model.bn.weight[1] = 1e-4  # a channel among the first four goes
    raw = torch.randint(0, 256, (4, 3, 16, 16)).float()
    example = torch.zeros(1, 3, 16, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        blind = slimming.prune(model, percent=0.3, example_inputs=example, compensate=False)
    with torch.no_grad():  # the hole: exact on what the check saw, off on raw images
        assert rel_diff(blind.model(raw), zeroed(model, blind.masks)(raw)) > 1e-3
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            seen = slimming.prune(model, percent=0.3, example_inputs=example, compensate=False,
                                  check_inputs=[raw[:2], raw[2:]])
        except slimming.SlimmingError as e:
            assert "\n" not in str(e)
            seen = None
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    if seen is not None:
        with torch.no_grad():
            assert rel_diff(seen.model(raw), zeroed(model, seen.masks)(raw)) < 1e-5
    for bad in ("images", [5], []):
        with pytest.raises(slimming.SlimmingError) as e:
            slimming.prune(model, percent=0.3, example_inputs=example, check_inputs=bad)
        assert e.value.params == ("check_inputs",)
    with pytest.raises(slimming.SlimmingError, match="give verify=True"):
        slimming.prune(model, percent=0.3, example_inputs=example, check_inputs=raw, verify=False)


class _Convolutions(torch.overrides.TorchFunctionMode):
    """Counts the convolutions whose arithmetic runs (a mode below any the trace or the run
    pushes: a convolution they answer by its shape alone never reaches it)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += func in (torch.conv1d, torch.conv2d, torch.conv3d)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("arch", ["resnet18", "mobilenet_v3_small"])
def test_the_unchecked_run_of_a_blank_example_asks_only_that_the_shapes_agree(arch):
    """verify=False on an all-zero example (default_example's): the pruned network runs on it
    as the trace ran the original, every convolution answered by its output's shape (no
    arithmetic: most of that forward's time), and the network it gives runs and is the same as
    the one a run on noise vouched for; on a real image it runs on noise, arithmetic and all."""
    model = torchvision.models.get_model(arch, weights=None, num_classes=10).eval()
    sparsity_shaped(model, 0)
    zeros, image = torch.zeros(1, 3, 64, 64), torch.rand(1, 3, 64, 64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with _Convolutions() as blank:
            unchecked = slimming.prune(model, percent=0.4, example_inputs=zeros, verify=False,
                                       compensate=False)
        with _Convolutions() as real:
            on_image = slimming.prune(model, percent=0.4, example_inputs=image, verify=False,
                                      compensate=False)
        checked = slimming.prune(model, percent=0.4, example_inputs=zeros, compensate=False)
    assert blank.count == 0 < real.count
    assert all(torch.equal(a, b) and torch.equal(a, c)
               for a, b, c in zip(unchecked.cfg_mask, on_image.cfg_mask, checked.cfg_mask))
    assert_exact(model, unchecked, torch.randn(2, 3, 64, 64))


def test_a_convolution_answered_by_its_shape_refuses_what_a_real_one_refuses():
    """capture.ShapesOnly, what the unchecked run of a blank example runs under: over random
    convolutions, some of them wrong as a bad cut leaves them (input channels, groups that do
    not divide the outputs, a bias of another length or dtype, an input of another dtype), it
    raises exactly where the real convolution raises, and otherwise gives zeros of the shape
    the real one gives."""
    from slimming.pruning.capture import ShapesOnly

    gen = torch.Generator().manual_seed(0)
    refused = 0
    for _ in range(200):
        d = int(torch.randint(1, 4, (1,), generator=gen))
        pick = lambda *xs: xs[int(torch.randint(len(xs), (1,), generator=gen))]  # noqa: E731
        groups, c_in, c_out = pick(1, 2, 4), pick(4, 8), pick(4, 6, 8)
        w = torch.randn(c_out, c_in // groups + pick(0, 0, 1), *[pick(1, 3)] * d, generator=gen)
        bias = pick(None, torch.randn(c_out), torch.randn(c_out + 1), torch.randn(c_out).double())
        x = torch.zeros(1, c_in, *[pick(4, 7)] * d, dtype=pick(torch.float32, torch.float32, torch.float64))
        stride, padding, dilation = (pick(1, 2),) * d, (pick(0, 1),) * d, (1,) * d  # as nn.Conv2d gives them
        conv = (F.conv1d, F.conv2d, F.conv3d)[d - 1]
        try:
            want = conv(x, w, bias, stride, padding, dilation, groups)
        except RuntimeError:
            want = None
        try:
            with ShapesOnly():
                got = conv(x, w, bias, stride, padding, dilation, groups)
        except RuntimeError:
            got = None
        assert (got is None) == (want is None)
        if want is None:
            refused += 1
        else:
            assert got.shape == want.shape and got.dtype == want.dtype and not got.any()
    assert 20 < refused < 180  # both kinds were tried
