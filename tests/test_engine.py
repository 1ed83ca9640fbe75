"""The training step: AMP and the sparsity term, schedules, optimizers."""

import math

import pytest
import torch
from conftest import TINY_VGG, randomize_bn
from torch import nn

from slimming import BNSparsity, models
from slimming.training.engine import Trainer, lr_factor, make_optimizer, make_scheduler


def zero_loss_step(amp_dtype, init_scale=2.0**30, strength=1e-2, lr=0.1):
    """One SGD step whose loss has zero gradient: the gamma update is the L1 term alone."""
    torch.manual_seed(0)
    model = models.build("vgg", cfg=TINY_VGG)
    randomize_bn(model, torch.Generator().manual_seed(0))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    trainer = Trainer(model, opt, make_scheduler(opt, 1), torch.device("cpu"),
                      sparsity=BNSparsity(model, strength), amp_dtype=amp_dtype)
    trainer.criterion = lambda out, y: 0.0 * out.sum()
    if trainer.scaler.is_enabled():
        trainer.scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    before = [bn.weight.detach().clone() for bn in model.prunable_bns()]
    _, _, applied = trainer.step(torch.randn(2, 3, 32, 32), torch.zeros(2, dtype=torch.long))
    after = [bn.weight.detach() for bn in model.prunable_bns()]
    return before, after, applied


@pytest.mark.parametrize("amp_dtype", [torch.float16, torch.bfloat16])
def test_sparsity_applies_to_unscaled_gradients(amp_dtype):
    """With a huge loss scale the gamma update is exactly the one without AMP."""
    before, plain, applied_plain = zero_loss_step(None)
    _, amp, applied = zero_loss_step(amp_dtype)
    assert applied and applied_plain
    for b, p, a in zip(before, plain, amp):
        assert torch.equal(p, b - 0.1 * 1e-2 * torch.sign(b))
        assert torch.equal(a, p)


def test_skipped_fp16_step_applies_nothing():
    torch.manual_seed(0)
    model = models.build("vgg", cfg=TINY_VGG)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    trainer = Trainer(model, opt, make_scheduler(opt, 1), torch.device("cpu"),
                      sparsity=BNSparsity(model, 1e-2), amp_dtype=torch.float16)
    trainer.criterion = lambda out, y: out.float().sum() * float("inf")  # inf gradients
    before = {k: v.clone() for k, v in model.state_dict().items()}
    _, _, applied = trainer.step(torch.randn(2, 3, 32, 32), torch.zeros(2, dtype=torch.long))
    assert not applied
    for k, v in model.state_dict().items():
        if "running" not in k and "num_batches" not in k:  # BN statistics do move in forward
            assert torch.equal(v, before[k]), k
    assert trainer.scaler.get_scale() < 2.0**16  # the scaler backed off


def test_bfloat16_autocast_trains_on_cpu():
    """bf16 autocast runs the convs in bfloat16, keeps float32 weights, and learns as fp32 does."""
    x, y = torch.randn(16, 3, 32, 32), torch.randint(10, (16,))

    def losses(amp_dtype):
        torch.manual_seed(0)
        model = models.build("vgg", cfg=TINY_VGG)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        trainer = Trainer(model, opt, make_scheduler(opt, 1), torch.device("cpu"), amp_dtype=amp_dtype)
        seen = []
        model.feature[0].register_forward_hook(lambda m, i, o: seen.append(o.dtype))
        out = [trainer.step(x, y)[0].item() for _ in range(30)]
        assert all(p.dtype == torch.float32 for p in model.parameters())
        assert not trainer.scaler.is_enabled()  # bfloat16 needs no loss scaling
        return out, seen[0]

    bf16, conv_dtype = losses(torch.bfloat16)
    fp32, _ = losses(None)
    assert conv_dtype == torch.bfloat16
    assert bf16[-1] < 0.7 * bf16[0]
    assert max(abs(a - b) for a, b in zip(bf16, fp32)) < 0.1


def test_grad_clip_does_not_weaken_sparsity():
    """Clipping happens before the L1 term is added, so S stays S."""
    torch.manual_seed(0)
    model = models.build("vgg", cfg=TINY_VGG)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    trainer = Trainer(model, opt, make_scheduler(opt, 1), torch.device("cpu"),
                      sparsity=BNSparsity(model, 1e-2), grad_clip=1e-6)
    before = [bn.weight.detach().clone() for bn in model.prunable_bns()]
    trainer.step(torch.randn(4, 3, 32, 32), torch.randint(10, (4,)))
    for b, bn in zip(before, model.prunable_bns()):
        delta = (b - bn.weight.detach()) / torch.sign(b)
        assert torch.allclose(delta, torch.full_like(delta, 1e-2), atol=2e-6)


def test_schedules():
    assert [lr_factor(e, 8) for e in range(8)] == pytest.approx([1, 1, 1, 1, .1, .1, .01, .01])
    cos = [lr_factor(e, 10, "cosine") for e in range(10)]
    assert cos[0] == 1 and all(a > b for a, b in zip(cos, cos[1:])) and cos[-1] > 0
    warm = [lr_factor(e, 10, "cosine", warmup_epochs=3) for e in range(5)]
    assert warm[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0]) and warm[4] < 1
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.2)
    sched = make_scheduler(opt, 4, "step")
    lrs = []
    for _ in range(4):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([0.2, 0.2, 0.02, 0.002])
    assert math.isclose(lr_factor(5, 10, "cosine"), 0.5)


def test_optimizers_and_no_wd_bn():
    model = models.build("vgg", cfg=TINY_VGG)
    opt = make_optimizer(model, "sgd", 0.1, 0.9, 5e-4, nesterov=True, no_wd_bn=True)
    bn_ids = {id(p) for bn in model.prunable_bns() for p in bn.parameters()}
    decayed, exempt = opt.param_groups
    assert {id(p) for p in exempt["params"]} == bn_ids and exempt["weight_decay"] == 0
    assert decayed["weight_decay"] == 5e-4 and not bn_ids & {id(p) for p in decayed["params"]}
    assert decayed["nesterov"]
    assert isinstance(make_optimizer(model, "adamw", 1e-3), torch.optim.AdamW)
    assert len(make_optimizer(model).param_groups) == 1
    with pytest.raises(ValueError):
        make_optimizer(model, "lion")


def test_label_smoothing_reaches_the_loss():
    model = models.build("vgg", cfg=TINY_VGG)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = Trainer(model, opt, make_scheduler(opt, 1), torch.device("cpu"), label_smoothing=0.2)
    x, y = torch.randn(8, 3, 32, 32), torch.randint(10, (8,))
    loss, out, _ = trainer.step(x, y)  # out: the logits the loss was computed from
    smoothed = torch.nn.functional.cross_entropy(out, y, label_smoothing=0.2)
    assert torch.allclose(loss, smoothed)
    assert not torch.allclose(loss, torch.nn.functional.cross_entropy(out, y))


def test_a_long_epoch_prints_progress_lines_into_a_log(monkeypatch, capsys):
    """With stdout a file, not a terminal, tqdm is silent: a plain line every PROGRESS_S."""
    from slimming.training import engine

    monkeypatch.setattr(engine, "PROGRESS_S", 0.0)  # every batch, for the test
    model = models.build("vgg", cfg=[4, "M", 4, "M", 4, "M", 4, "M", 8])
    opt = make_optimizer(model, lr=0.01)
    trainer = Trainer(model, opt, make_scheduler(opt, 1), torch.device("cpu"))
    batches = [(torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))) for _ in range(3)]
    trainer.train_one_epoch(batches)
    lines = [x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("train: batch")]
    assert [x.split()[2] for x in lines] == ["1/3", "2/3", "3/3"] and all("loss" in x for x in lines)


@pytest.mark.parametrize("accs", [[0.0, 0.0, 10.0, 5.0], [30.0, 20.0, 40.0], [0.0]])
def test_best_pth_follows_the_best_epoch_and_exists_after_the_first(tmp_path, accs):
    """best.pth holds the best epoch so far; a run whose first epochs score 0% still has one
    (the one-epoch run on a small pack scored 0% and left nothing to prune or evaluate)."""
    from slimming.training.saver import CheckpointSaver
    model = models.build("vgg", cfg=TINY_VGG)
    saver, best = CheckpointSaver(tmp_path), 0.0
    for epoch, acc in enumerate(accs, 1):
        is_best = acc > best
        best = max(best, acc)
        saver.save(model, {"epoch": epoch, "test_acc": acc}, {}, best_acc=best, is_best=is_best)
        kept = torch.load(tmp_path / "best.pth", weights_only=True)
        first_best = next(i for i, a in enumerate(accs[:epoch], 1) if a == max(accs[:epoch]))
        assert kept["epoch"] == first_best and kept["acc"] == max(accs[:epoch])
        assert torch.load(tmp_path / "last.pth", weights_only=True)["epoch"] == epoch


def test_a_diverging_run_says_so_once_and_a_settling_one_says_nothing():
    """DivergenceWatch: a training loss at 1.5x its lowest epoch, a test loss at 10x its lowest,
    a test loss that is not finite: one warning each, the first time; noise and falling losses
    none."""
    from slimming.training.engine import DivergenceWatch

    def run(train, test):
        watch = DivergenceWatch()
        return [m for i, (a, b) in enumerate(zip(train, test)) for m in
                watch.see({"epoch": i + 1, "train_loss": a, "test_loss": b})]

    assert run([2.9, 2.1, 2.3, 1.9, 2.0], [80.0, 7.4, 9.0, 1.6, 1.7]) == []  # noise, a first wild test
    assert run([0.01, 0.05, 0.04], [0.01, 0.05, 0.02]) == []  # tiny losses: a rise under 0.1 is noise
    said = run([2.9, 3.5, 6.0, 9.0, 12.0], [2.0, 3.0, 11437.0, 20000.0, float("nan")])
    assert len(said) == 3, said
    assert said[0].startswith("the train loss rose to 6 at epoch 3 from 2.9: the run may be diverging")
    assert said[1].startswith("the test loss rose to 1.144e+04 at epoch 3 from 2")
    assert said[2].startswith("the test loss is nan at epoch 5: the run diverged")


@pytest.mark.slow
def test_a_run_whose_loss_climbs_warns_on_the_command_line(tmp_path, capsys):
    """A learning rate warmed up far too high: the loss climbs from the first epoch on, and the
    run says so in one line while it trains (before, 2.9 -> 6.0 went by without a word)."""
    from slimming.cli import main

    assert main(["train", "--arch", "vgg", "--cfg", "8,M,16,M,16,M,32,M,32", "--dataset", "synthetic",
                 "--epochs", "3", "--lr", "60", "--warmup-epochs", "4", "--seed", "0", "--cpu",
                 "--save", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "slimming train: warning: the train loss rose to" in err and "may be diverging" in err
    assert err.count("train loss rose") == 1
