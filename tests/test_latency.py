"""The latency budget and round_to="auto" (slimming.pruning.speed), driven by a deterministic
latency model: every assertion is about behaviour, none about time. The real timer
(slimming.measure.latency.MeasuredLatency) is tested for its cache, not its figures."""

import json
import math
import re

import pytest
import torch
import torchvision
from conftest import sparsity_shaped, zeroed
from torch import nn

import slimming
from slimming.errors import SlimmingError, parse_latency
from slimming.measure import latency
from slimming.measure.latency import MeasuredLatency, layer_specs
from slimming.pruning.records import LatencyBudget
from slimming.pruning.speed import TOLERANCE
from slimming.tools.sweep import sweep
from slimming.utils.modules import modes_kept


class StepLatency:
    """A device whose layers cost their multiply-adds with each width rounded up to a multiple
    of ``step`` (a staircase, as vector units give), plus ``overhead`` per layer; a network
    costs the sum over its layers, the same in every sample (no spread)."""

    def __init__(self, step: int = 8, overhead: float = 0.0):
        self.step, self.overhead, self.calls = step, overhead, 0

    def up(self, c: int) -> int:
        return -(-c // self.step) * self.step

    def layer(self, spec, in_ch: int, out_ch: int) -> float:
        positions = math.prod(d for d in spec.shape if d)  # batch x input positions
        kernel = math.prod(spec.kernel) if spec.kernel else 1
        reads = 1 if spec.depthwise else self.up(in_ch)
        return 1e-6 * positions * kernel * reads * self.up(out_ch) + self.overhead

    def network(self, models, inputs):
        self.calls += 1
        out = []
        for m in models:
            with modes_kept(m):
                m.eval()
                specs = layer_specs(m, inputs)
            # the device's truth (a subclass may give the table something else)
            out.append([sum(StepLatency.layer(self, s, s.full_in, s.full_out) for s in specs.values())] * 5)
        return out


def cost(model, x, device=None) -> float:
    return (device or StepLatency()).network([model], (x,))[0][0]


class TwoScales(nn.Module):
    """A conv at 32x32 (costly per channel) and one at 4x4 (cheap per channel) after pooling."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.big = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU())
        self.pool = nn.AvgPool2d(8)
        self.small = nn.Sequential(nn.Conv2d(32, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU())
        self.head = nn.Conv2d(32, 32, 1)
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        x = self.small(self.pool(self.head(self.big(self.stem(x)))))
        return self.fc(x.mean((2, 3)))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("asked", [0.3, 0.5, 0.7])
@pytest.mark.slow
def test_a_latency_budget_lands_on_the_fraction_asked(seed, asked, one_thread):
    model = torchvision.models.resnet18(num_classes=10).eval()
    sparsity_shaped(model, seed)
    x = torch.randn(1, 3, 64, 64)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    device = StepLatency()
    result = slimming.prune(model, target_latency=asked, example_inputs=x, latency_model=device)
    b = result.budget
    assert b.what == "latency" and b.unit == "fraction" and b.asked == asked
    achieved = cost(result.model, x) / cost(model, x)
    assert b.ratio == pytest.approx(achieved) == b.achieved
    # this device is what the table models (a layer costs the product of its two stepped
    # widths; the network, the sum of its layers): the estimate of the network cut is exact
    assert b.rounds[0].estimated_ms == pytest.approx(b.rounds[0].ms, rel=1e-9)
    # the estimate is exact for this device: the cut lands within the tolerance, though a step
    # of a residual stream at 0.3 is 5% of the network (the greedy's last big step is retried)
    assert abs(achieved - asked) <= TOLERANCE * asked, (achieved, b.rounds)
    assert b.met and b.spread == 0
    if abs(b.rounds[0].ratio - asked) <= TOLERANCE * asked:
        assert len(b.rounds) == 1  # a first cut that lands needs no second
    assert result.verified is not None and result.verified < 1e-3  # checked: exact
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # untouched
    out = result.model(x)
    assert out.shape == (1, 10) and torch.isfinite(out).all()


def test_an_absolute_budget_in_milliseconds(one_thread):
    model = torchvision.models.resnet18(num_classes=10).eval()
    sparsity_shaped(model, 3)
    x = torch.randn(2, 3, 64, 64)
    full = cost(model, x)
    result = slimming.prune(model, target_latency=f"{0.6 * full:.6f}ms", example_inputs=x,
                            latency_model=StepLatency())
    assert result.budget.unit == "ms" and result.budget.target_ms == pytest.approx(0.6 * full, rel=1e-5)
    assert cost(result.model, x) <= 0.6 * full * (1 + TOLERANCE)
    assert result.budget.batch == 2 and result.budget.achieved == result.budget.ms


def test_latency_saved_per_importance_decides_where_the_cut_falls(one_thread):
    """Every gamma equal: a channel of the layers at 32x32 saves 64x what one at 4x4 saves, so
    the costly layers lose channels and the cheap one keeps all of its own."""
    torch.manual_seed(0)
    model = TwoScales().eval()
    for bn in (model.stem[1], model.big[1], model.small[1]):
        bn.weight.data.fill_(0.5)
    x = torch.randn(1, 3, 32, 32)
    result = slimming.prune(model, target_latency=0.6, example_inputs=x, latency_model=StepLatency())
    kept = {n: int(m.sum()) for n, m in result.masks.items()}
    assert kept["small.1"] == 32 and kept["big.1"] + kept["stem.1"] < 48, kept
    # sparsity says otherwise: channels at zero in the cheap layer cost no importance, so they go
    # first, whatever they save
    model.small[1].weight.data[:16] = 0
    result = slimming.prune(model, target_latency=0.6, example_inputs=x, latency_model=StepLatency())
    assert int(result.masks["small.1"].sum()) == 16


@pytest.mark.parametrize("step", [8, 16])
def test_round_to_auto_keeps_widths_at_the_top_of_a_step(step, one_thread):
    """On a staircase of ``step`` channels, a width between two steps costs as much as the
    step's top: round_to="auto" gives every cut layer a multiple of the step (or all it had)."""
    model = torchvision.models.resnet18(num_classes=10).eval()
    sparsity_shaped(model, 4)
    x = torch.randn(1, 3, 64, 64)
    device = StepLatency(step)
    plain = slimming.prune(model, percent=0.37, example_inputs=x)
    auto = slimming.prune(model, percent=0.37, example_inputs=x, round_to="auto", latency_model=device)
    widths = [(m.numel(), int(m.sum())) for m in auto.cfg_mask]
    assert all(a % step == 0 or a == n for n, a in widths), widths
    assert any(a % step for _, a in ((m.numel(), int(m.sum())) for m in plain.cfg_mask))  # it did something
    # only keeps more: each layer at least what the percent alone kept
    assert all(int(a.sum()) >= int(p.sum()) for a, p in zip(auto.cfg_mask, plain.cfg_mask))
    assert cost(auto.model, x, device) == pytest.approx(cost(auto.model, x, device))
    # and a latency budget with round_to="auto" lands on step tops too
    timed = slimming.prune(model, target_latency=0.5, example_inputs=x, round_to="auto", latency_model=device)
    assert all(int(m.sum()) % step == 0 or bool(m.all()) for m in timed.cfg_mask)
    assert timed.budget.ratio <= 0.5 * (1 + TOLERANCE)


def test_the_family_and_depthwise_paths_take_a_latency_budget(one_thread):
    """A shipped family (VGG, its own surgery) and a grouped/depthwise network (MobileNetV2)."""
    vgg = slimming.models.build("vgg", cfg=[16, "M", 32, "M", 64, 64, "M", 64, 64, "M", 64])
    sparsity_shaped(vgg, 5)
    r = slimming.prune(vgg, target_latency=0.5, latency_model=StepLatency())
    assert isinstance(r.cfg, list) and r.budget.ratio <= 0.5 * (1 + TOLERANCE)
    mobile = torchvision.models.mobilenet_v2(num_classes=10).eval()
    sparsity_shaped(mobile, 6)
    x = torch.randn(1, 3, 64, 64)
    r = slimming.prune(mobile, target_latency=0.6, example_inputs=x, latency_model=StepLatency(),
                       ignore=("classifier.1",))
    assert r.budget.ratio <= 0.6 * (1 + TOLERANCE) and r.verified is not None
    assert r.budget.ratio == pytest.approx(cost(r.model, x) / cost(mobile, x))
    first = r.budget.rounds[0]  # depthwise layers, estimated exactly too
    assert first.estimated_ms == pytest.approx(first.ms, rel=1e-9)


def test_the_measurement_corrects_the_estimate(one_thread):
    """A device slower than its table (every network costs 1.5x its layers, plus a fixed part
    the table cannot see): the first cut misses, the next rounds correct the goal from the
    measurement and land within the tolerance; every round is reported."""

    class Skewed(StepLatency):
        def network(self, models, inputs):
            return [[1.5 * t + 0.2 for t in s] for s in super().network(models, inputs)]

    model = torchvision.models.resnet18(num_classes=10).eval()
    sparsity_shaped(model, 7)
    x = torch.randn(1, 3, 64, 64)
    r = slimming.prune(model, target_latency=0.5, example_inputs=x, latency_model=Skewed(overhead=0.01))
    rounds = r.budget.rounds
    assert r.budget.met and abs(r.budget.ratio - 0.5) <= 0.5 * TOLERANCE, rounds
    assert len(rounds) >= 2 and all(rd.ms == pytest.approx(rd.ratio * rd.original_ms) for rd in rounds)


def test_where_the_table_sees_no_saving_the_cut_is_found_by_measurement(one_thread):
    """Layers that cost their launch, not their width (a small network on several threads):
    the table sees nothing to save, so the global ranking's share is bisected on end-to-end
    measurements alone (NetAdapt's way), and still lands on the budget. (Removing a branch
    would save its layers' launches: the table sees that, so here branches are kept.)"""

    class Launch(StepLatency):
        def layer(self, spec, in_ch, out_ch):
            return 1e3  # every layer the same at every width, alone slower than the whole network

    model = torchvision.models.resnet18(num_classes=10).eval()
    sparsity_shaped(model, 11)
    x = torch.randn(1, 3, 64, 64)
    r = slimming.prune(model, target_latency=0.5, example_inputs=x, latency_model=Launch(),
                       remove_branches=False)
    b = r.budget
    assert all(rd.goal_ms is None for rd in b.rounds) and 2 <= len(b.rounds) <= 5
    assert b.ratio == pytest.approx(cost(r.model, x) / cost(model, x))
    assert 0.4 <= b.ratio <= 0.5 * (1 + TOLERANCE), b.rounds
    assert r.verified is not None


@pytest.mark.parametrize("value, match", [
    ("fast", "fraction such as 0.5 or a time"), (0, "fraction in"), (-1, "fraction in"),
    ("0ms", "positive time"), (float("nan"), "target_latency"), (True, "target_latency"),
])
def test_bad_latency_budgets_are_one_line_errors(value, match):
    model = slimming.models.build("vgg", cfg=[8, "M", 8, "M", 8, "M", 8, "M", 8])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(SlimmingError, match=match) as e:
        slimming.prune(model, target_latency=value, latency_model=StepLatency())
    assert "\n" not in str(e.value) and "target_latency" in e.value.params
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_a_budget_no_network_meets_is_refused_with_the_measured_figure(one_thread):
    model = slimming.models.build("vgg", cfg=[16, "M", 32, "M", 32, "M", 32, "M", 32])
    sparsity_shaped(model, 8)
    device = StepLatency(overhead=1.0)  # fixed costs the cut cannot touch
    with pytest.raises(SlimmingError, match="cannot be met: the smallest network") as e:
        slimming.prune(model, target_latency=0.1, latency_model=device)
    assert "measured" in str(e.value)
    with pytest.raises(SlimmingError, match="at or above the unpruned"):
        slimming.prune(model, target_latency=f"{10 * cost(model, torch.zeros(1, 3, 32, 32), device)}ms",
                       latency_model=device)
    with pytest.raises(SlimmingError, match="exactly one of"):
        slimming.prune(model, percent=0.5, target_latency=0.5)


def test_a_budget_the_table_thinks_reachable_but_no_network_meets_is_one_error_line(one_thread):
    """Hostile round 6: where the table sees savings the device does not give (a network its
    launches bound: each measured network costs a fixed part its layers' table cannot see), the
    corrected rounds still missed and the result came back met=False, exit 0; now the smallest
    network the limits allow is measured too, and the budget refused in one line with its figure.
    A budget it can meet that way is met."""

    class Bound(StepLatency):
        def network(self, models, inputs):
            return [[t + 5 * self.fixed for t in s] for s in super().network(models, inputs)]

    model = slimming.models.build("vgg", cfg=[16, "M", 32, "M", 32, "M", 32, "M", 32]).eval()
    sparsity_shaped(model, 8)
    x = torch.zeros(1, 3, 32, 32)
    device = Bound()
    device.fixed = cost(model, x)  # the launches: five times all the layers' work
    with pytest.raises(SlimmingError, match="cannot be met: the smallest network .* measured") as e:
        slimming.prune(model, target_latency=0.5, example_inputs=x, latency_model=device)
    assert "\n" not in str(e.value)
    r = slimming.prune(model, target_latency=0.95, example_inputs=x, latency_model=device)
    assert r.budget.met and r.budget.ratio <= 0.95 * (1 + TOLERANCE)


def test_round_to_auto_where_width_costs_nothing_says_so(one_thread):
    """Hostile round 6: on a device where no layer gets faster narrower, every step's top is
    the full width and percent=0.5 cut 0 channels without a word; now one warning says why
    and what to give instead."""

    class Flat(StepLatency):
        def layer(self, spec, in_ch, out_ch):
            return 1.0

    model = slimming.models.build("vgg", cfg=[16, "M", 32, "M", 32, "M", 32, "M", 32]).eval()
    sparsity_shaped(model, 8)
    with pytest.warns(UserWarning, match=r"round_to='auto': no layer's measured latency falls .* give "
                                         r"round_to a number"):
        r = slimming.prune(model, percent=0.5, example_inputs=torch.zeros(1, 3, 32, 32), round_to="auto",
                           latency_model=Flat())
    assert r.ranked[1] == 0


def test_parse_latency():
    assert parse_latency(0.5) == ("fraction", 0.5)
    assert parse_latency("0.25") == ("fraction", 0.25)
    assert parse_latency("12ms") == ("ms", 12.0)
    assert parse_latency(" 12 ms ") == ("ms", 12.0)
    assert parse_latency("0.012s") == ("ms", 12.0)
    assert parse_latency("1e1ms") == ("ms", 10.0)
    assert parse_latency(15) == ("ms", 15.0)


def test_a_latency_sweep_reports_the_measured_latency(one_thread):
    model = slimming.models.build("vgg", cfg=[16, "M", 32, "M", 64, "M", 64, "M", 64])
    sparsity_shaped(model, 9)
    data = [(torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,)))]
    rows = sweep(model, data, torch.device("cpu"), [0.4, 0.7], axis="latency",
                 options={"latency_model": StepLatency()})
    assert rows[0]["reference"] and rows[0]["latency_kept"] == 1.0
    assert [r["target"] for r in rows[1:]] == [0.4, 0.7]
    assert all(r["latency_kept"] <= r["target"] * (1 + TOLERANCE) for r in rows[1:])
    assert rows[1]["latency_ms"] < rows[2]["latency_ms"] < rows[0]["latency_ms"]


def test_the_table_is_cached_per_device_and_can_be_cleared(tmp_path, monkeypatch, capsys, steady_clock):
    """On the deterministic clock: a real timing can be noisy on a busy machine, and a noisy
    timing is rightly never written, so the second table would time it again."""
    monkeypatch.setenv(latency.CACHE_ENV, str(tmp_path))
    spec = latency.spec_of(nn.Conv2d(4, 8, 1), torch.randn(1, 4, 4, 4))
    first = MeasuredLatency("cpu")
    ms = first.layer(spec, 4, 8)
    first.layer(spec, 4, 8)
    assert ms > 0 and first.measured == 1
    first.save()
    folder, tables, size = latency.cache_info()
    assert folder == tmp_path / "latency" and tables == 1 and size > 0
    again = MeasuredLatency("cpu")
    assert again.layer(spec, 4, 8) == ms and again.measured == 0  # from the file, not timed
    assert again.describe()["entries"] == 1 and again.describe()["threads"] == torch.get_num_threads()
    # a damaged, foreign or oversized table is a cache miss, never an error
    first.path.write_text("{not json")
    assert MeasuredLatency("cpu").entries == {}
    first.path.write_text(json.dumps({"context": {"device": "elsewhere"}, "entries": {"k": 1.0}}))
    assert MeasuredLatency("cpu").entries == {}
    first.path.write_text(json.dumps({"context": first.context, "entries": {"k": "nan", "j": -1, "i": 2}}))
    assert MeasuredLatency("cpu").entries == {"i": 2.0}
    from slimming.cli import main
    assert main(["cache"]) == 0 and "1 latency table(s)" in capsys.readouterr().out
    assert main(["cache", "--clear"]) == 0 and "removed 1 latency table(s)" in capsys.readouterr().out
    assert latency.cache_info()[1] == 0


def test_the_command_line_prunes_to_a_latency_and_the_file_loads_safely(tmp_path, capsys, one_thread,
                                                                        steady_clock):
    """slimming prune --target-latency on a checkpoint: the pruned file holds the budget record
    in plain values (the weights_only loader takes it) and rebuilds."""
    from slimming import checkpoint_dict, load_model, save_checkpoint
    from slimming.cli import main
    from slimming.io.checkpoint import load_checkpoint

    model = slimming.models.build("vgg", cfg=[16, "M", 32, "M", 64, "M", 64, "M", 64]).eval()
    sparsity_shaped(model, 10)
    save_checkpoint(checkpoint_dict(model), tmp_path / "sparse.pth")
    code = main(["prune", "--checkpoint", str(tmp_path / "sparse.pth"), "--target-latency", "0.7",
                 "--latency-batch", "4", "--save", str(tmp_path / "fast"), "--cpu", "--no-eval"])
    out = capsys.readouterr().out
    assert code == 0 and "latency budget 0.7 of" in out and "at batch 4" in out and "latency table:" in out
    ckpt = load_checkpoint(tmp_path / "fast" / "pruned.pth")  # weights_only: plain values only
    b = ckpt["budget"]
    assert b["what"] == "latency" and b["asked"] == 0.7 and b["batch"] == 4 and b["rounds"]
    assert LatencyBudget.from_dict(b).ratio == b["ratio"] and b["runtime"] == "eager"
    assert type(b["table"]["torch"]) is str and "path" not in b["table"]  # no local path in a shared file
    small = load_model(tmp_path / "fast" / "pruned.pth")
    assert sum(v for v in small.cfg if v != "M") < 16 + 32 + 64 * 3


def test_sweep_takes_latency_budgets_from_the_command_line(tmp_path, capsys, one_thread, steady_clock):
    """slimming sweep --target-latency 0.6,0.8: a row per budget with the latency measured,
    the reference row's too, in the CSV, the JSON and the Markdown."""
    from slimming import checkpoint_dict, save_checkpoint
    from slimming.cli import main

    model = slimming.models.build("vgg", cfg=[16, "M", 32, "M", 64, "M", 64, "M", 64]).eval()
    sparsity_shaped(model, 12)
    save_checkpoint(checkpoint_dict(model), tmp_path / "sparse.pth")
    code = main(["sweep", "--checkpoint", str(tmp_path / "sparse.pth"), "--target-latency", "0.6,0.8",
                 "--latency-batch", "2", "--save", str(tmp_path / "sweep"), "--dataset", "synthetic",
                 "--cpu", "--recalibrate-bn", "0", "--workers", "0"])
    out = capsys.readouterr().out
    assert code == 0 and out.count("latency") >= 3
    rows = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert [r.get("target") for r in rows] == [None, 0.6, 0.8]
    assert all(r["latency_ms"] > 0 and 0 < r["latency_kept"] <= 1 for r in rows)
    assert "latency (measured)" in (tmp_path / "sweep" / "sweep.md").read_text()
    assert "latency_kept" in (tmp_path / "sweep" / "sweep.csv").read_text().splitlines()[0]


def test_under_a_latency_budget_widths_are_multiples_of_8_unless_asked_otherwise(one_thread):
    """The default under a latency budget is round_to=8, the channel blocks vector units run:
    where the table sees no saving and the share of channels is bisected on measurements
    (a small network on several threads), the global ranking alone would leave any width (a
    stem of 64 cut to 1 on a busy machine), and does with round_to=1; FLOPs budgets keep the
    paper's widths."""

    class Launch(StepLatency):
        def layer(self, spec, in_ch, out_ch):
            return 1e3

    model = torchvision.models.resnet18(num_classes=10).eval()
    sparsity_shaped(model, 14)
    x = torch.randn(1, 3, 64, 64)
    default = slimming.prune(model, target_latency=0.5, example_inputs=x, latency_model=Launch(),
                             remove_branches=False)  # a branch removed would be a saving the table sees
    widths = default.layer_table()
    assert all(rd.goal_ms is None for rd in default.budget.rounds)  # bisected on measurements
    assert all(a % 8 == 0 or a == b for _, b, a in widths), widths
    assert any(a < b for _, b, a in widths) and default.budget.ratio <= 0.5 * (1 + TOLERANCE)
    plain = slimming.prune(model, target_latency=0.5, example_inputs=x, latency_model=Launch(), round_to=1,
                           remove_branches=False)
    assert any(a % 8 for _, b, a in plain.layer_table() if a < b)
    flops = slimming.prune(model, target_flops=0.5, example_inputs=x)
    assert any(a % 8 for _, b, a in flops.layer_table() if a < b)


def test_the_command_line_says_when_a_cut_leaves_widths_off_multiples_of_8(tmp_path, capsys):
    from slimming import checkpoint_dict, save_checkpoint
    from slimming.cli import main

    model = slimming.models.build("vgg", cfg=[16, "M", 32, "M", 64, "M", 64, "M", 64]).eval()
    sparsity_shaped(model, 15)
    save_checkpoint(checkpoint_dict(model), tmp_path / "sparse.pth")
    args = ["prune", "--checkpoint", str(tmp_path / "sparse.pth"), "--percent", "0.43", "--cpu", "--no-eval"]
    assert main([*args, "--save", str(tmp_path / "plain")]) == 0
    out = capsys.readouterr().out
    assert re.search(r"note: \d+ of the \d+ layers cut have widths that are not multiples of 8", out), out
    assert main([*args, "--round-to", "8", "--save", str(tmp_path / "eight")]) == 0
    assert "multiples of 8" not in capsys.readouterr().out


@pytest.mark.parametrize("seed", range(2))
def test_a_latency_budget_removes_branches_where_their_layers_fixed_cost_is_the_saving(one_thread, seed):
    """Where every layer costs a launch beside its multiply-adds (batch 1 on a CPU), a branch
    removed saves its layers' launches, which no thinning saves: the search weighs that, so
    the same budget is met with more of the network's multiply-adds kept than with the
    branches kept at min_channels, and the removed network is the exact cut."""
    model = torchvision.models.resnet18(num_classes=10).eval()
    sparsity_shaped(model, seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # the branches sparsity training emptied: every second block's inner width
        for block in (model.layer1[1], model.layer2[1], model.layer3[1], model.layer4[1]):
            block.bn1.weight.mul_(1e-3 * torch.rand(1, generator=gen).item())
    x = torch.randn(1, 3, 64, 64)
    device = StepLatency(overhead=5.0)
    found = {}
    for remove in (True, False):
        r = slimming.prune(model, target_latency=0.8, example_inputs=x, latency_model=device,
                           remove_branches=remove, compensate=False)
        assert r.budget.ratio <= 0.8 * (1 + TOLERANCE), (remove, r.budget.rounds)
        found[remove] = r
    removed, kept = found[True], found[False]
    blocks = [n.removesuffix(".conv2") for n, what in removed.removed.items() if what == "Constant"]
    assert kept.removed == {} and blocks, removed.removed
    assert all(removed.removed[f"{b}.conv1"] == removed.removed[f"{b}.bn1"] == "Emptied" for b in blocks)
    macs = [cost(r.model, x, StepLatency()) for r in (removed, kept)]
    assert macs[0] > macs[1], macs  # fewer channels cut for the same budget
    z = zeroed(model, removed.masks)
    probe = torch.randn(2, 3, 48, 48, generator=gen)
    assert float((removed.model(probe) - z(probe)).abs().max()) <= 1e-4 * float(z(probe).abs().max())
