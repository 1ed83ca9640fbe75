"""Latency on a busy machine (slimming.measure.timing, the measurement in slimming.pruning.speed):
the estimator and its spread, more samples where noise needs them, a one-line refusal where
they cannot resolve the budget, noisy layer timings kept out of the table, and what is
remembered of a network between prunes. Every device here is injected and seeded: no
assertion depends on how fast this machine is."""

import json
import math
import random
import statistics
import warnings

import pytest
import torch
import torchvision
from conftest import sparsity_shaped
from test_latency import StepLatency, cost
from torch import nn

import slimming
from slimming.errors import SlimmingError
from slimming.measure import latency, timing
from slimming.measure.latency import MeasuredLatency
from slimming.pruning import speed
from slimming.pruning.records import CountBudget, LatencyBudget, LatencyRound


def busy(truth: list[float], rounds: int, rng: random.Random, delay: float = 0.5,
         spell: float = 1.0) -> list[list[float]]:
    """Samples of networks whose true times are ``truth`` on a busy machine: most samples
    delayed (exponential, mean ``delay`` of the time), and slow spells that fall on a whole
    round (both networks alike), as interleaving sees them."""
    out = [[] for _ in truth]
    for _ in range(rounds):
        slow = 1 + rng.expovariate(1 / spell) if rng.random() < 0.3 else 1.0
        for t, o in zip(truth, out):
            extra = rng.expovariate(1 / delay) if rng.random() < 0.7 else 0.0
            o.append(t * slow * (1 + extra))
    return out


def test_a_low_quantile_and_a_paired_ratio_see_through_delays():
    rng = random.Random(0)
    original, pruned = busy([10.0, 5.0], 48, rng)
    e = timing.estimate(original)
    assert e.value < statistics.median(original) and e.value == pytest.approx(10.0, rel=0.25)
    r = timing.ratio(original, pruned)
    assert r.value == pytest.approx(0.5, abs=r.spread + 0.02)
    assert timing.scaled(r, e).value == pytest.approx(r.value * e.value)
    same = timing.estimate([3.0] * 10)
    assert same.value == 3.0 and same.spread == 0.0 and same.samples == 10


@pytest.mark.slow
def test_the_spread_is_honest_and_shrinks_with_samples():
    """Over 200 seeded busy measurements, the true ratio lies within the printed spread in at
    least 85% of them (the spread is a 95% half-width); more rounds, a smaller spread."""
    for truth in (0.3, 0.5, 0.8):
        inside, spreads = 0, {12: [], 48: []}
        for seed in range(100):
            for n in spreads:
                a, b = busy([20.0, 20.0 * truth], n, random.Random(1000 * seed + n))
                r = timing.ratio(a, b)
                inside += abs(r.value - truth) <= r.spread
                spreads[n].append(r.spread)
        assert inside >= 0.85 * 200, (truth, inside)
        assert statistics.median(spreads[48]) < 0.7 * statistics.median(spreads[12])


class Noisy(StepLatency):
    """The step device on a busy machine (``busy``): ``per_call`` rounds a call, ``delay`` the
    mean delay; ``rounds_only``: quiet while the original is timed alone; ``everywhere``: every
    sample off by a factor (log-normal), none left clean."""

    def __init__(self, delay: float = 0.3, seed: int = 0, per_call: int = 12, rounds_only: bool = False,
                 everywhere: bool = False, **kw):
        super().__init__(**kw)
        self.everywhere = everywhere
        self.delay, self.rng, self.per_call = delay, random.Random(seed), per_call
        self.rounds_only = rounds_only
        self.samples = 0

    def network(self, models, inputs):
        truth = [s[0] for s in super().network(models, inputs)]
        self.samples += self.per_call
        if self.rounds_only and len(models) == 1:
            return [[t] * self.per_call for t in truth]
        if self.everywhere:  # no sample escapes it: a machine far busier than its cores
            return [[t * math.exp(self.rng.gauss(0, 1)) for _ in range(self.per_call)] for t in truth]
        return busy(truth, self.per_call, self.rng, self.delay, spell=self.delay)


def resnet(seed: int):
    model = torchvision.models.resnet18(num_classes=10).eval()
    sparsity_shaped(model, seed)
    return model


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.slow
def test_a_busy_machine_takes_more_samples_and_still_lands_within_the_spread(seed, one_thread):
    model, x = resnet(seed), torch.randn(1, 3, 64, 64)
    device = Noisy(delay=0.3, seed=seed)
    r = slimming.prune(model, target_latency=0.5, example_inputs=x, latency_model=device)
    b = r.budget
    truth = cost(r.model, x) / cost(model, x)
    assert abs(b.ratio - truth) <= b.ratio_spread + 0.01, (b.ratio, b.ratio_spread, truth)
    assert b.ratio_spread <= speed.NOISE * 0.5 and b.best.samples >= 12
    assert truth <= 0.5 + b.ratio_spread + speed.TOLERANCE * 0.5 or not b.met
    # the three figures agree: the cut's latency is the ratio times the original's
    assert b.ms == pytest.approx(b.ratio * b.original_ms)


def test_a_measurement_too_noisy_for_the_budget_is_refused_in_one_line(one_thread):
    model, x = resnet(3), torch.randn(1, 3, 64, 64)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        out = model(x)
    for device, what in ((Noisy(seed=4, everywhere=True), "the unpruned network's latency"),
                         (Noisy(delay=20.0, seed=5, rounds_only=True),
                          "the cut's latency over the original's")):
        with pytest.raises(SlimmingError, match="cannot be measured precisely enough") as e:
            slimming.prune(model, target_latency=0.5, example_inputs=x, latency_model=device)
        msg = str(e.value)
        assert "\n" not in msg and what in msg and "torch.set_num_threads(1)" in msg and "+-" in msg
        assert e.value.params == ("target_latency",)
        assert device.samples >= timing.MAX_SAMPLES  # it tried the cap first
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    with torch.no_grad():
        assert torch.equal(model(x), out)  # bit for bit: the model as given


class Remembering(StepLatency):
    """The step device with a memory (what MeasuredLatency keeps in its table file)."""

    def __init__(self, scale: float = 1.0, **kw):
        super().__init__(**kw)
        self.memory, self.scale, self.alone = {}, scale, 0

    def network(self, models, inputs):
        self.alone += len(models) == 1
        return [[self.scale * (1.5 * t + 0.2) for t in s] for s in super().network(models, inputs)]

    def recall(self, key):
        return self.memory.get(key)

    def remember(self, key, record):
        self.memory[key] = json.loads(json.dumps(record))  # plain values, as the file keeps them


def test_what_the_table_was_off_by_is_remembered_and_the_next_prune_starts_there(one_thread):
    """A device 1.5x slower than its table, plus a fixed cost: the first prune needs rounds of
    correction; the same network again (other weights) is timed only beside its first cut and
    lands in fewer rounds, from the corrected goal."""
    x = torch.randn(1, 3, 64, 64)
    device = Remembering(overhead=0.01)
    first = slimming.prune(resnet(7), target_latency=0.5, example_inputs=x, latency_model=device).budget
    assert len(first.rounds) >= 2 and device.alone == 1 and len(device.memory) == 1
    (record,) = device.memory.values()
    assert record["ms"] == pytest.approx(first.rounds[-1].original_ms)
    assert len(record["seen"]) == len(first.rounds)
    again = slimming.prune(resnet(8), target_latency=0.5, example_inputs=x, latency_model=device).budget
    assert device.alone == 1  # not timed alone again
    assert len(again.rounds) < len(first.rounds) and again.met
    assert again.rounds[0].goal_ms != pytest.approx(0.5 * again.rounds[0].original_ms)  # corrected


@pytest.mark.slow
def test_a_network_now_slower_than_remembered_is_said_and_a_damaged_memory_is_none(one_thread):
    x = torch.randn(1, 3, 64, 64)
    device = Remembering()
    slimming.prune(resnet(9), target_latency=0.6, example_inputs=x, latency_model=device)
    device.scale = 3.0  # the machine is three times busier now
    with pytest.warns(UserWarning, match="runs at .* ms here now, .* when it was last timed.*busier"):
        b = slimming.prune(resnet(9), target_latency=0.6, example_inputs=x, latency_model=device).budget
    assert b.met  # the ratio still holds
    for bad in ({"ms": "fast", "spread": 1}, {"ms": float("nan")}, {"ms": -3.0, "spread": 0.0},
                {"ms": 100.0, "spread": 30.0}, {"ms": 1.0, "spread": 0.01, "seen": [[1, "x"], 5]}):
        key = next(iter(device.memory))
        device.memory = {key: bad}
        device.scale, device.alone = 1.0, 0
        b = slimming.prune(resnet(9), target_latency=0.6, example_inputs=x, latency_model=device).budget
        usable = bad.get("ms") == 1.0  # a figure, precise enough: the damaged pairs alone are left out
        assert b.met and (device.alone == 1) == (not usable), bad


class Recorded(MeasuredLatency):
    """The real table with layer samples given by a script instead of the clock."""

    def __init__(self, script, **kw):
        super().__init__(**kw)
        self.script, self.timed = script, []

    def _time(self, spec, in_ch, out_ch):
        self.timed.append((in_ch, out_ch))
        return list(self.script(in_ch, out_ch, len(self.timed)))


def test_noisy_layer_timings_are_used_but_never_written(tmp_path, monkeypatch):
    monkeypatch.setenv(latency.CACHE_ENV, str(tmp_path))
    spec = latency.spec_of(nn.Conv2d(16, 16, 3), torch.randn(1, 16, 8, 8))
    steady = [1.0, 1.02, 1.01, 1.03, 1.0, 1.01, 1.02]

    def script(i, o, n):
        if (i, o) == (8, 16):
            return [1.0, 3.0, 2.5, 4.0, 1.1, 2.8, 3.3]  # a busy spell every time: noisy
        if (i, o) == (16, 8) and n <= 4:
            return [9.0] * 7  # slower than the full layer once (a busy spell), then steady
        return [0.5 * v for v in steady] if (i, o) == (16, 8) else steady

    t = Recorded(script, device="cpu")
    assert t.layer(spec, 16, 16) == pytest.approx(timing.low_quantile(steady))
    noisy = t.layer(spec, 8, 16)
    assert noisy == pytest.approx(1.0, rel=0.1)  # the low quantile: the busy samples do not lead
    assert t.timed.count((8, 16)) == latency.LAYER_TRIES  # taken again while they disagreed
    assert t.layer(spec, 16, 8) == pytest.approx(0.5, rel=0.05)  # narrower but slower: timed again
    t.save()
    written = json.loads(t.path.read_text())
    assert written["context"]["format"] == latency.TABLE_FORMAT and written["context"]["runtime"] == "eager"
    keys = set(written["entries"])
    assert spec.key(16, 16) in keys and spec.key(16, 8) in keys and spec.key(8, 16) not in keys
    assert t.describe()["noisy"] == 1
    assert spec.key(8, 16) not in MeasuredLatency("cpu").entries  # timed again by the next prune


def test_a_table_that_is_not_a_regular_file_is_not_read(tmp_path, monkeypatch):
    monkeypatch.setenv(latency.CACHE_ENV, str(tmp_path))
    t = MeasuredLatency("cpu")
    t.path.parent.mkdir(parents=True)
    t.path.symlink_to("/dev/zero")
    assert MeasuredLatency("cpu").entries == {}  # at once: never read to the end of /dev/zero
    t.path.unlink()
    import os
    os.mkfifo(t.path)
    assert MeasuredLatency("cpu").entries == {}  # a FIFO with no writer: not waited on


@pytest.mark.slow
def test_the_probe_reads_the_same_widths_off_the_plan_as_off_built_networks():
    import timm

    from slimming.measure.latency import layer_specs
    from slimming.pruning import estimate
    from slimming.pruning.importance import DEFAULT
    from slimming.pruning.plans import traced_plan

    nets = [torchvision.models.resnet18(), torchvision.models.mobilenet_v3_small(),
            torchvision.models.shufflenet_v2_x0_5(), timm.create_model("convnext_atto")]
    for model in nets:
        model.eval()
        sparsity_shaped(model, 1)
        x = torch.randn(1, 3, 64, 64)
        if isinstance(model, timm.models.ConvNeXt):
            slimming.add_gates(model, x)
        plan = traced_plan(model, DEFAULT, x, ())
        specs = layer_specs(model, (x,))
        by_plan = estimate.probe(plan, model, specs)
        plan.cuts = None
        built = estimate.probe(plan, model, specs)
        assert [(t.ins, t.outs) for t in by_plan] == [(t.ins, t.outs) for t in built]
        assert sum(bool(t.ins or t.outs) for t in built) > len(specs) // 2


def test_the_records_read_as_the_old_dicts_did_with_a_warning_and_round_trip():
    rd = LatencyRound(1.0, 1.1, 1.2, 0.05, 2.5, 0.1, 0.48, 0.02, 24)
    b = LatencyBudget(0.5, "fraction", 1.25, True, [rd], batch=2)
    with pytest.warns(FutureWarning, match=r"read \.ratio, not \['fraction'\]"):
        assert b["fraction"] == 0.48
    with pytest.warns(FutureWarning):
        assert b["rounds"][0]["achieved_ms"] == 1.2 and b.get("what") == "latency"
    with pytest.raises(KeyError):
        b["nothing"]  # noqa: B018
    with pytest.raises(KeyError):
        b["as_dict"]  # noqa: B018 (a method is no field)
    assert b.achieved == 0.48 and b.spread == 0.02 and b.best is rd
    again = LatencyBudget.from_dict(json.loads(json.dumps(b.as_dict())))
    assert again == b
    ms = LatencyBudget(1.3, "ms", 1.3, True, [rd])
    assert ms.achieved == 1.2 and ms.spread == 0.05
    c = CountBudget("flops", 0.5, 5e5, 4e5, 1e6, 0.3)
    assert c.met and c.as_dict()["achieved"] == 4e5
    with pytest.warns(FutureWarning):
        assert c["full"] == 1e6
    assert LatencyBudget.from_dict({"what": "latency"}) is None
    assert LatencyBudget.from_dict(c.as_dict()) is None
    assert math.isclose(LatencyBudget.from_dict({**b.as_dict(), "chosen": -1}).ratio, 0.48)


@pytest.mark.parametrize("runtime", ["eager", "export", "onnxruntime"])
@pytest.mark.slow
def test_a_network_runs_in_the_runtime_it_is_timed_in(runtime, monkeypatch):
    """``prepared`` runs the very network in that runtime (its outputs are the model's), and
    MeasuredLatency's network timings call it there: an onnxruntime session for "onnxruntime"."""
    import onnxruntime

    from slimming.measure.runtimes import prepared

    model = slimming.models.build("vgg", cfg=[8, "M", 16, "M", 16, "M", 16, "M", 16]).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        want = model(x)
    got = prepared(model, (x,), runtime)()
    got = torch.as_tensor(got[0] if isinstance(got, list) else got)
    assert torch.allclose(got, want, atol=1e-4)
    runs = []
    real = onnxruntime.InferenceSession.run
    monkeypatch.setattr(onnxruntime.InferenceSession, "run",
                        lambda self, *a, **k: runs.append(1) or real(self, *a, **k))
    t = MeasuredLatency("cpu", repeats=3, cache=False, runtime=runtime)
    samples = t.network([model], (x,))
    assert len(samples) == 1 and len(samples[0]) == 3 and all(v > 0 for v in samples[0])
    assert (len(runs) >= 3) == (runtime == "onnxruntime") and t.context["runtime"].startswith(runtime)
    assert MeasuredLatency("cpu", runtime=runtime).path != MeasuredLatency("cpu").path or runtime == "eager"


def test_a_runtime_slimming_cannot_time_is_one_line():
    with pytest.raises(SlimmingError, match="unknown latency runtime 'tvm'; choose one of: eager, export, "):
        MeasuredLatency("cpu", runtime="tvm")
    with pytest.raises(SlimmingError, match="onnxruntime latency is timed on the CPU"):
        MeasuredLatency("meta", runtime="onnxruntime")

    class NoExport(nn.Module):
        def forward(self, x):
            return x.relu() if x.sum().item() > 0 else x  # data-dependent: torch.export refuses it

    from slimming.measure.runtimes import prepared

    with pytest.raises(SlimmingError, match="cannot be timed in export: it does not export") as e:
        prepared(NoExport(), (torch.randn(1, 3),), "export")
    assert "\n" not in str(e.value)


def test_the_command_line_prunes_to_a_latency_in_onnxruntime(tmp_path, capsys, one_thread, steady_clock):
    from slimming import checkpoint_dict, save_checkpoint
    from slimming.cli import main
    from slimming.io.checkpoint import load_checkpoint

    model = slimming.models.build("vgg", cfg=[16, "M", 32, "M", 64, "M", 64, "M", 64]).eval()
    sparsity_shaped(model, 13)
    save_checkpoint(checkpoint_dict(model), tmp_path / "sparse.pth")
    code = main(["prune", "--checkpoint", str(tmp_path / "sparse.pth"), "--target-latency", "0.6",
                 "--latency-runtime", "onnxruntime", "--latency-seconds", "5",
                 "--save", str(tmp_path / "fast"), "--cpu", "--no-eval"])
    out = capsys.readouterr().out
    assert code == 0 and "(onnxruntime on " in out, out
    b = LatencyBudget.from_dict(load_checkpoint(tmp_path / "fast" / "pruned.pth")["budget"])
    assert b.runtime == "onnxruntime" and b.table["runtime"].startswith("onnxruntime ") and b.met
    with pytest.raises(SystemExit) as e:
        main(["prune", "--checkpoint", str(tmp_path / "sparse.pth"), "--target-latency", "0.6",
              "--latency-runtime", "tvm", "--save", str(tmp_path / "no"), "--cpu"])
    assert e.value.code == 2
    assert "invalid choice: 'tvm'" in capsys.readouterr().err and not (tmp_path / "no").exists()


def test_the_cache_command_counts_and_empties_only_its_own_tables(tmp_path, monkeypatch, capsys):
    """slimming cache --clear through a symlinked latency/ deletes nothing where it points, and
    in the folder itself only the tables (a JSON file of the user's stays)."""
    from slimming.cli import main

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "0123456789abcdef.json").write_text("{}")
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "latency").symlink_to(elsewhere)
    monkeypatch.setenv(latency.CACHE_ENV, str(tmp_path / "cache"))
    assert main(["cache", "--clear"]) == 0 and "removed 0 latency table(s)" in capsys.readouterr().out
    assert (elsewhere / "0123456789abcdef.json").exists()
    monkeypatch.setenv(latency.CACHE_ENV, str(tmp_path / "own"))
    t = MeasuredLatency("cpu")
    t.remember("k", {"ms": 1.0})
    t.save()
    (t.path.parent / "notes.json").write_text("{}")
    assert latency.cache_info()[1] == 1
    assert main(["cache", "--clear"]) == 0 and not t.path.exists() and (t.path.parent / "notes.json").exists()
    dangling = t.path.parent / "fedcba9876543210.json"  # a link to nothing: neither command fails on it
    dangling.symlink_to(tmp_path / "nowhere.json")
    t.remember("k2", {"ms": 2.0})
    t.save()
    capsys.readouterr()
    assert main(["cache"]) == 0 and "1 latency table(s)" in capsys.readouterr().out
    assert main(["cache", "--clear"]) == 0 and "removed 1 latency table(s)" in capsys.readouterr().out
    assert not t.path.exists() and dangling.is_symlink()


def test_a_grouped_layer_narrower_and_slower_is_believed(tmp_path, monkeypatch):
    """A grouped convolution cut narrower can have fewer groups (gcd of the widths) and more
    work per channel: slower for real, timed once and written, not taken for noise."""
    monkeypatch.setenv(latency.CACHE_ENV, str(tmp_path))
    spec = latency.spec_of(nn.Conv2d(32, 32, 3, groups=8), torch.randn(1, 32, 8, 8))
    t = Recorded(lambda i, o, n: [1.0] * 7 if (i, o) == (32, 32) else [2.0] * 7, device="cpu")
    t.layer(spec, 32, 32)
    assert t.layer(spec, 28, 32) == 2.0 and t.timed.count((28, 32)) == 1 and not t.noisy


def test_the_table_each_measurement_and_each_sweep_point_show_progress(monkeypatch, steady_clock, one_thread):
    """What a latency prune and a sweep spend their time on is counted on a progress bar (a
    terminal only: tqdm's own rule): the table's layers, each measurement's rounds, the points."""
    import tqdm as tqdm_module

    from slimming.tools import sweep as sweep_module
    from slimming.utils import progress

    bars = []

    class Seen(tqdm_module.tqdm):
        def __init__(self, *a, **k):
            k["disable"] = k.get("disable") is True  # shown here whatever the terminal
            super().__init__(*a, **k)
            bars.append(self)

    monkeypatch.setattr(progress, "tqdm", Seen)  # every bar is made there
    model = slimming.models.build("vgg", cfg=[16, "M", 32, "M", 32, "M", 32, "M", 32]).eval()
    sparsity_shaped(model, 16)
    r = slimming.prune(model, target_latency=0.6, latency_model=MeasuredLatency("cpu", cache=False))
    table = [b for b in bars if b.desc == "latency table"]
    assert len(table) == 1 and table[0].n == table[0].total == r.budget.table["measured"] > 0
    rounds = [b for b in bars if b.desc.startswith("latency: cut ")]
    assert [b.n for b in rounds] == [rd.samples for rd in r.budget.rounds]
    assert any(b.desc == "latency: the original" and b.n >= 12 for b in bars)
    bars.clear()
    data = [(torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,)))]
    sweep_module.sweep(model, data, torch.device("cpu"), [0.3, 0.6], axis="percent")
    assert [b.n for b in bars if b.desc == "sweep (percent)"] == [2]


def _odd(state: str, tmp_path, monkeypatch) -> None:
    """The table's file or folder in an odd state (hostile round 6)."""
    import os

    cache = tmp_path / "cache"
    monkeypatch.setenv(latency.CACHE_ENV, str(cache))
    path = MeasuredLatency("cpu").path
    if state in ("nested", "huge-entry", "directory"):
        path.parent.mkdir(parents=True)
        if state == "nested":
            path.write_text("[" * 100_000)
        elif state == "huge-entry":
            context = json.dumps(MeasuredLatency("cpu", cache=False).context)
            path.write_text('{"context": ' + context + ', "entries": {"k": 1' + "0" * 400 + "}}")
        else:
            path.mkdir()
    elif state == "cache-dir-a-file":
        cache.write_text("")
    elif state == "latency-a-file":
        cache.mkdir()
        (cache / "latency").write_text("")
    elif state == "read-only":
        cache.mkdir()
        os.chmod(cache, 0o500)
        if os.access(cache, os.W_OK):  # root writes anyway: a folder it cannot make instead
            monkeypatch.setenv(latency.CACHE_ENV, "/proc/slimming-cache")


STATES = ["nested", "huge-entry", "directory", "cache-dir-a-file", "latency-a-file", "read-only"]


@pytest.mark.parametrize("state", STATES)
def test_a_cache_that_cannot_be_read_or_written_never_loses_the_result(state, tmp_path, monkeypatch,
                                                                       steady_clock, one_thread):
    """A latency table that cannot be read is empty, one that cannot be written is said in one
    warning; the prune's result stands (no RecursionError, OverflowError or OSError after all
    its work), and from the command line the pruned file is written."""
    from slimming import checkpoint_dict, count_params, save_checkpoint
    from slimming.cli import main

    _odd(state, tmp_path, monkeypatch)
    assert MeasuredLatency("cpu").entries == {}  # read: empty, at once
    model = slimming.models.build("vgg", cfg=[16, "M", 32, "M", 32, "M", 32, "M", 32]).eval()
    sparsity_shaped(model, 16)
    unwritable = state not in ("nested", "huge-entry")  # those two are written over, as a cache is
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        result = slimming.prune(model, target_latency=0.7, example_inputs=torch.zeros(1, 3, 32, 32))
    said = [w for w in seen if "the latency table was not written" in str(w.message)]
    assert result.budget.rounds and count_params(result.model) < count_params(model)
    assert bool(said) == unwritable and all("\n" not in str(w.message) for w in said)
    assert unwritable or MeasuredLatency("cpu").entries  # the damaged table was made again
    save_checkpoint(checkpoint_dict(model), tmp_path / "sparse.pth")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = main(["prune", "--checkpoint", str(tmp_path / "sparse.pth"), "--target-latency", "0.7",
                     "--save", str(tmp_path / "out"), "--cpu", "--no-eval"])
    assert code == 0 and (tmp_path / "out" / "pruned.pth").is_file()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: MeasuredLatency('cuda') times on it")
def test_a_timer_on_a_device_that_is_not_here_is_one_line():
    for device in ("cuda", "cuda:3"):
        with pytest.raises(SlimmingError) as e:
            MeasuredLatency(device)
        assert e.value.params == ("device",) and "\n" not in str(e.value)
    with pytest.raises(SlimmingError, match="takes a device"):
        MeasuredLatency("gpu please")


@pytest.mark.parametrize("gives", [[], [[]], [[1.0], [2.0], [3.0]], [["fast"]], [[float("nan")]], [[-1.0]],
                                   None])
def test_a_latency_model_whose_network_gives_no_timings_is_one_line(gives, one_thread):
    """Hostile round 6: a latency model's network() giving no samples (or not one list per
    network, or no times) was a raw IndexError or TypeError deep in the search."""

    class Broken(StepLatency):
        def network(self, models, inputs):
            return gives

    model = slimming.models.build("vgg", cfg=[16, "M", 32, "M", 32, "M", 32, "M", 32]).eval()
    sparsity_shaped(model, 16)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(SlimmingError) as e:
        slimming.prune(model, target_latency=0.6, example_inputs=torch.zeros(1, 3, 32, 32),
                       latency_model=Broken())
    assert e.value.params == ("latency_model",) and "\n" not in str(e.value)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
