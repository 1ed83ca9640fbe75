"""How much a prune cuts, read once where it enters (slimming.pruning.amount.Amount)."""

import random
import subprocess
import sys

import pytest
import torch
from conftest import TINY_VGG

import slimming
from slimming import SlimmingError, models
from slimming.pruning import amount as amount_module
from slimming.pruning.amount import KINDS, Amount


def test_each_way_of_saying_how_much_is_one_record_with_its_unit():
    rng = random.Random(0)
    for _ in range(200):
        kind = rng.choice(KINDS)
        if kind == "percent":
            v, unit = rng.uniform(0, 0.999), "share"
        elif kind == "threshold":
            v, unit = rng.uniform(0, 10), "score"
        elif kind == "target_latency":
            v, unit = rng.choice([(rng.uniform(0.01, 0.99), "fraction"), (rng.uniform(1, 500), "ms")])
        else:
            v, unit = rng.choice([(rng.uniform(0.01, 0.99), "fraction"),
                                  (float(rng.randint(1, 10**9)), "count")])
        a = Amount.of(**{kind: v})
        assert (a.kind, a.value, a.unit, a.given) == (kind, v, unit, v)
        assert a.what == {"target_flops": "flops", "target_params": "params"}.get(kind)
    assert Amount.of(target_latency="12ms") == Amount("target_latency", 12.0, "ms", "12ms")
    assert Amount.of(target_latency="0.02s").value == 20.0


@pytest.mark.parametrize("given,param", [
    ({}, KINDS), ({"percent": 0.5, "threshold": 0.1}, KINDS),
    ({"percent": 1.0}, "percent"), ({"percent": "0.5"}, "percent"), ({"percent": True}, "percent"),
    ({"threshold": -1.0}, "threshold"), ({"threshold": float("inf")}, "threshold"),
    ({"target_flops": 0}, "target_flops"), ({"target_params": -3.0}, "target_params"),
    ({"target_flops": float("nan")}, "target_flops"), ({"target_latency": "fast"}, "target_latency"),
    ({"target_latency": 0}, "target_latency"), ({"target_latency": "0ms"}, "target_latency"),
])
def test_what_is_no_amount_is_one_line_naming_its_parameter(given, param):
    with pytest.raises(SlimmingError) as e:
        Amount.of(**given)
    assert e.value.params == ((param,) if isinstance(param, str) else param) and "\n" not in str(e.value)


@pytest.mark.parametrize("value,hint", [(70, "; did you mean 0.7?"), (12.5, "; did you mean 0.125?"),
                                        (1.0, ""), (100, ""), (250, ""), (-5, "")])
def test_a_percentage_given_for_a_fraction_is_asked_about(value, hint):
    """percent=70 (a percentage, where a fraction in [0, 1) is asked): "did you mean 0.7?", and
    the model is not touched; 1 (all of them?) and what is no percentage get no guess."""
    model = models.build("vgg", cfg=TINY_VGG)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(SlimmingError) as e:
        slimming.prune(model, percent=value)
    assert str(e.value) == f"percent must be in [0, 1), got {value}{hint}"
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_the_command_line_reads_an_amount_without_torch():
    code = ("import sys; from slimming.pruning.amount import Amount\n"
            "assert Amount.of(target_latency='12ms').unit == 'ms'\n"
            "assert 'torch' not in sys.modules")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


@pytest.mark.parametrize("how", [{"percent": 0.4}, {"threshold": 0.3}, {"target_flops": 0.6},
                                 {"target_params": 0.7}])
def test_prune_reads_the_amount_once_and_cuts_by_it(monkeypatch, how):
    reads = []
    real = Amount.of.__func__

    def counted(cls, *args, **kwargs):
        reads.append((args, kwargs))
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(amount_module.Amount, "of", classmethod(counted))
    g = torch.Generator().manual_seed(0)
    model = models.build("vgg", cfg=TINY_VGG, num_classes=10).eval()
    for bn in model.prunable_bns():
        bn.weight.data = torch.rand(bn.num_features, generator=g)
    result = slimming.prune(model, **how, compensate=False, example_inputs=torch.zeros(1, 3, 32, 32))
    assert len(reads) == 1
    assert sum(w for w in result.model.cfg if w != "M") < sum(w for w in TINY_VGG if w != "M")
    if "target_flops" in how or "target_params" in how:
        assert result.budget.met and result.budget.asked == next(iter(how.values()))
