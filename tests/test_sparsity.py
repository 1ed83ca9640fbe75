import pytest
import torch
from conftest import randomize_bn
from torch import nn

from slimming import BNSparsity, add_l1_subgradient, models
from slimming.data import TensorImages, synthetic_images


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
