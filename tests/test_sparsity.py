from types import SimpleNamespace

import pytest
import torch
from conftest import randomize_bn
from torch import nn

import slimming
from slimming import BNSparsity, add_l1_subgradient, models
from slimming.data import TensorImages, synthetic_images
from slimming.training.engine import lr_factor
from slimming.training.sparsity import SparsityController


def with_random_grads(model, gen):
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=gen)


@pytest.mark.parametrize("arch,cfg", [("vgg", [8, "M", 16, "M", 16, "M", 8, "M", 8]),
                                      ("nin", [6, 5, 4, 3, 6, 5, 4, 3])])
def test_update_is_exactly_grad_plus_s_sign_gamma(arch, cfg):
    gen = torch.Generator().manual_seed(0)
    model = models.build(arch, cfg=cfg)
    randomize_bn(model, gen)
    with torch.no_grad():
        model.prunable_bns()[0].weight[0] = 0.0  # sign(0) = 0: no push
    with_random_grads(model, gen)
    before = {n: p.grad.clone() for n, p in model.named_parameters()}
    s = 3e-4
    BNSparsity(model, s).apply()
    prunable = {id(bn.weight) for bn in model.prunable_bns()}
    for name, p in model.named_parameters():
        if id(p) in prunable:
            assert torch.equal(p.grad, before[name] + s * torch.sign(p.detach())), name
        else:  # conv/linear weights, BN biases, and NIN's last (never pruned) BN
            assert torch.equal(p.grad, before[name]), name
    assert model.prunable_bns()[0].weight.grad[0] == before["feature.1.weight"][0]


def test_one_fused_kernel_for_all_layers(monkeypatch):
    model = models.build("vgg", depth=11)
    with_random_grads(model, torch.Generator().manual_seed(1))
    calls = []
    real = torch._foreach_add_
    monkeypatch.setattr(torch, "_foreach_add_", lambda *a, **k: calls.append(len(a[0])) or real(*a, **k))
    BNSparsity(model, 1e-4).apply()
    assert calls == [8]  # one call covering the 8 BN layers, no per-layer loop


def test_params_without_grad_are_skipped_and_zero_strength_is_a_no_op():
    model = models.build("vgg", cfg=[4, "M", 4, "M", 4, "M", 4, "M", 4])
    add_l1_subgradient([bn.weight for bn in model.prunable_bns()], 1e-3)  # no grads yet
    assert all(bn.weight.grad is None for bn in model.prunable_bns())
    with_random_grads(model, torch.Generator().manual_seed(2))
    g = model.feature[1].weight.grad.clone()
    BNSparsity(model, 0.0).apply()
    assert torch.equal(model.feature[1].weight.grad, g)
    with pytest.raises(ValueError):
        BNSparsity(model, -1.0)


def test_fraction_below():
    model = models.build("vgg", cfg=[4, "M", 4, "M", 4, "M", 4, "M", 4])
    with torch.no_grad():
        model.feature[1].weight.copy_(torch.tensor([0.0, -0.005, 0.02, -0.5]))
    assert BNSparsity(model, 1e-4).fraction_below(1e-2) == pytest.approx(2 / 20)


def test_sparsity_training_shrinks_gammas():
    """The same seeded SGD steps with a strong L1 term end with far smaller |gamma|."""
    images, labels = synthetic_images(256)
    data = TensorImages(images, labels)
    x = (data.images.float() / 255 - 0.5) / 0.25

    def run(strength):
        torch.manual_seed(0)
        model = models.build("vgg", cfg=[8, "M", 16, "M", 16, "M", 16, "M", 16])
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        sparsity = BNSparsity(model, strength)
        for i in range(0, 256, 32):
            loss = nn.functional.cross_entropy(model(x[i:i + 32]), labels[i:i + 32])
            opt.zero_grad()
            loss.backward()
            sparsity.apply()
            opt.step()
        return torch.cat([bn.weight.detach().abs() for bn in model.prunable_bns()]).mean()

    assert run(0.2) < 0.7 * run(0.0)


def steered(start: float, target: float, epochs: int = 5, steps: int = 200, n: int = 1000, seed: int = 0):
    """A toy of sparsity training under the controller: n gammas from 0.5, a third of them
    useful (the loss pulls them back towards a value in (0.5, 1)), all with gradient noise
    proportional to |gamma|; plain SGD steps, the step schedule's learning rate from 0.1.
    Returns the final fraction under 1e-2 and the (lr, factor) of every check."""
    gen = torch.Generator().manual_seed(seed)
    gamma = torch.full((n,), 0.5)
    useful = torch.rand(n, generator=gen) < 0.35
    centre = 0.5 + 0.5 * torch.rand(n, generator=gen)
    sparsity = SimpleNamespace(params=[gamma], strength=start)
    controller = SparsityController(target)
    checks = []
    for epoch in range(epochs):
        lr = 0.1 * lr_factor(epoch, epochs)
        controller.start_epoch(sparsity, epoch, epochs, steps, lr)
        for i in range(steps):
            grad = (torch.where(useful, 0.2 * (gamma - centre), 0.0) + sparsity.strength * gamma.sign()
                    + 0.5 * gamma.abs() * torch.randn(n, generator=gen))
            gamma -= lr * grad
            if controller.due(i + 1):
                before = sparsity.strength
                sparsity.strength = controller.update(sparsity, i + 1)
                checks.append((lr, sparsity.strength / before))
    return (gamma.abs() < 1e-2).float().mean().item(), checks


@pytest.mark.parametrize("start", [1e-5, 1e-4, 1e-3, 1e-2])
@pytest.mark.parametrize("target,epochs", [(0.3, 5), (0.5, 5), (0.5, 6), (0.6, 8), (0.5, 12), (0.3, 12)])
def test_the_controller_reaches_its_target_from_any_start(start, target, epochs):
    """The issue-16 promise: within 0.05 of F from any start in [1e-5, 1e-2], in runs as short
    as 5 epochs and as long as 12 (issue 24: the long runs overshot), and never a raise once
    the learning rate is under half its peak."""
    fraction, checks = steered(start, target, epochs, seed=int(start * 1e6) + epochs)
    assert abs(fraction - target) <= 0.05, (fraction, checks)
    assert all(factor <= 1 for lr, factor in checks if lr < 0.05)
    assert all(0.5 <= factor <= 4 for _, factor in checks)


def test_the_controllers_rule():
    gamma = torch.linspace(0.2, 0.6, 100)  # the 0.5-quantile is about 0.4
    sparsity = SimpleNamespace(params=[gamma], strength=1e-4)
    c = SparsityController(0.5)
    c.start_epoch(sparsity, 0, 10, 100, 0.1)
    assert c.interval == 10 and c.due(10) and not c.due(11)
    assert c.update(sparsity, 10) == pytest.approx(2e-4)  # q did not move: behind, x2
    gamma -= 0.3  # q fell 0.3 in 10 steps, far faster than the 0.39 over 390 steps it needs
    assert c.update(sparsity, 20) == pytest.approx(0.5e-4)  # ahead of the path: /2 (the most)
    gamma -= 0.001  # q rose (the negative gammas grew): x2, not the x4 that swung back and forth
    assert c.update(sparsity, 30) == pytest.approx(2e-4)
    gamma.copy_(torch.linspace(0.0, 0.02, 100))  # 3% -> 50% under 1e-2 in one check: heading
    assert c.update(sparsity, 40) == pytest.approx(0.5e-4)  # for 97% by the next, so halved
    assert c.update(sparsity, 50) == pytest.approx(1e-4)  # 50% and staying there: held
    gamma.copy_(torch.linspace(0.0, 0.015, 100))  # 67% under: more than F + 0.02, halved
    assert c.update(sparsity, 60) == pytest.approx(0.5e-4)
    gamma.copy_(torch.cat([torch.full((23,), 0.005), torch.linspace(0.05, 0.4, 77)]))  # 3% -> 23%:
    # heading for 43% by the next check: x2^0.28, not the x2 of a q that rose
    c.last_fraction = 0.03
    assert c.update(sparsity, 70) == pytest.approx(1e-4 * 2 ** (2 * (0.5 - 0.43) / 0.5))
    fresh = SparsityController(0.5)
    gamma.copy_(torch.linspace(0.2, 0.6, 100))
    fresh.start_epoch(sparsity, 0, 10, 100, 0.1)
    gamma -= 0.0001 * 10  # q fell 1e-4 a step, 1e-3 needed: x4 capped
    assert fresh.update(sparsity, 10) == pytest.approx(4e-4)
    c.start_epoch(sparsity, 5, 10, 100, 0.01)  # the learning rate fell under half its peak
    gamma.copy_(torch.linspace(0.2, 0.6, 100))
    assert c.update(sparsity, 10) == pytest.approx(1e-4)  # behind, but never raised now
    assert c.peak_lr == 0.1
    with pytest.raises(slimming.SlimmingError):
        SparsityController(1.5)


def test_a_target_out_of_reach_does_not_run_away():
    """F = 0.8 where only 65% of the toy's channels are useless: the strength stops at its
    ceiling (a pull of half the bound a step), and the useless channels still end under 1e-2
    instead of every gamma oscillating over it."""
    fraction, checks = steered(1e-2, 0.8, 5, seed=3)
    strength, highest = 1e-2, 0.0
    for _, factor in checks:
        strength *= factor
        highest = max(highest, strength)
    assert highest <= 1e-2 / (2 * 0.1) * (1 + 1e-9)
    assert 0.55 <= fraction < 0.8


@pytest.mark.parametrize("ignore", [0, "", [""], False, 1.5, ("stem", "nope")])
def test_sparsity_reads_ignore_as_prune_does(ignore):
    """Sparsity's ignore= is prune's: what prune refuses (0, '' naming the whole model, a name no
    module has) Sparsity refuses in the same line, instead of taking 0 or '' for 'nothing'."""
    model = nn.Sequential()
    model.add_module("stem", nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)))
    model.add_module("head", nn.Sequential(nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4)))
    x = torch.zeros(1, 3, 8, 8)
    with pytest.raises(slimming.SlimmingError) as theirs:
        slimming.prune(model, percent=0.3, example_inputs=x, ignore=ignore)
    with pytest.raises(slimming.SlimmingError) as ours:
        BNSparsity(model, 1e-4, ignore=ignore)
    assert str(ours.value) == str(theirs.value) and ours.value.params == ("ignore",)


@pytest.mark.parametrize("ignore,pushed", [((), 2), (None, 2), ("head", 1), (["stem", "head"], 0),
                                           (nn.BatchNorm2d, 0), ("head.1", 1)])
def test_sparsity_skips_what_prune_keeps_whole(ignore, pushed):
    model = nn.Sequential()
    model.add_module("stem", nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)))
    model.add_module("head", nn.Sequential(nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4)))
    assert len(BNSparsity(model, 1e-4, ignore=ignore).params) == pushed
