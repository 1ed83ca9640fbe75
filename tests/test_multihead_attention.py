"""``torch.nn.MultiheadAttention`` as slimming cuts it (``slimming.layers.attention``): its
forward in the steps a hand-written attention takes computes what torch's does, whatever the
arguments; networks built on it (torchvision's ViT, ``nn.TransformerEncoder``) lose tokens'
channels and whole heads exactly, and load back into a fresh instance; a cross-attention, which
it does not decompose, is kept whole while the rest is cut."""

import itertools

import pytest
import torch
from conftest import rel_diff, sparsity_shaped, zeroed
from torch import nn

import slimming
from slimming.layers.attention import MultiheadAttention, decomposed

torchvision = pytest.importorskip("torchvision")


def _masks(kind: str, b: int, n: int, heads: int, gen: torch.Generator):
    """(key_padding_mask, attn_mask) of one kind: bool or float, 2-D or per head."""
    padding = attn = None
    if "pad" in kind:
        padding = torch.rand(b, n, generator=gen) > 0.6
        padding[:, 0] = False  # every query sees a key
        if "float" in kind:
            padding = padding.float() * -1e4
    if "attn2" in kind:
        attn = torch.rand(n, n, generator=gen) > 0.7
        attn.fill_diagonal_(False)
        if "float" in kind:
            attn = attn.float() * -1e4
    if "attn3" in kind:
        attn = torch.randn(b * heads, n, n, generator=gen)
        if "pad" in kind and "float" not in kind:
            padding = padding.float() * -1e4
    return padding, attn


@pytest.mark.parametrize("batch_first", [True, False])
def test_the_decomposed_forward_computes_what_torchs_does(batch_first):
    """Every mask kind (none, key padding, 2-D, per head, bool or float, both), with and
    without the weights (averaged or per head), causal, unbatched, with and without autograd:
    the outputs and weights of torch's own forward."""
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    m = nn.MultiheadAttention(16, 4, batch_first=batch_first).eval()
    b, n = 3, 6
    kinds = ["", "pad", "pad float", "attn2", "attn2 float", "attn3", "pad attn2", "pad attn3 float"]
    for kind, need, average, grad in itertools.product(kinds, [True, False], [True, False], [True, False]):
        x = torch.randn((b, n, 16) if batch_first else (n, b, 16), generator=gen)
        padding, attn = _masks(kind, b, n, 4, gen)
        kw = dict(key_padding_mask=padding, attn_mask=attn, need_weights=need, average_attn_weights=average)
        with torch.set_grad_enabled(grad):
            want = m(x, x, x, **kw)
            with decomposed(m):
                assert type(m) is MultiheadAttention
                got = m(x, x, x, **kw)
        assert type(m) is nn.MultiheadAttention
        assert rel_diff(got[0], want[0]) < 1e-5, (kind, need, average, grad)
        assert (got[1] is None) == (want[1] is None) and (got[1] is None or rel_diff(got[1], want[1]) < 1e-5)
    causal = nn.Transformer.generate_square_subsequent_mask(n)
    for need in (True, False):
        x = torch.randn((b, n, 16) if batch_first else (n, b, 16), generator=gen)
        want = m(x, x, x, attn_mask=causal, is_causal=True, need_weights=need)[0]
        with decomposed(m):
            assert rel_diff(m(x, x, x, attn_mask=causal, is_causal=True, need_weights=need)[0], want) < 1e-5
    one = torch.randn(n, 16, generator=gen)  # unbatched
    with decomposed(m):
        got = m(one, one, one)
    want = m(one, one, one)
    assert rel_diff(got[0], want[0]) < 1e-5 and rel_diff(got[1], want[1]) < 1e-5


def sparse(model: nn.Module, seed: int) -> None:
    """Sparsity-shaped factors, and 8 of the 32 channels of the residual stream near zero in
    every LayerNorm, as sparsity training leaves them."""
    sparsity_shaped(model, seed)
    small = torch.randperm(32, generator=torch.Generator().manual_seed(seed))[:8]
    with torch.no_grad():
        for norm in (m for m in model.modules() if isinstance(m, nn.LayerNorm)):
            norm.weight[small] *= 1e-3


def vit(seed: int) -> nn.Module:
    """torchvision's VisionTransformer, small, its classifier random (torchvision starts it at
    zero, which would hide any difference)."""
    torch.manual_seed(seed)
    model = torchvision.models.VisionTransformer(image_size=48, patch_size=16, num_layers=2, num_heads=4,
                                                 hidden_dim=32, mlp_dim=64, num_classes=10).eval()
    nn.init.normal_(model.heads.head.weight, std=0.2)
    return model


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_torchvision_vit_loses_token_channels_and_whole_heads_exactly(seed, tmp_path):
    """On torchvision's ViT (``nn.MultiheadAttention`` inside): head gates go on each
    attention's ``out_proj``, which torch's own forward never calls, so the attention runs as
    slimming's (the same outputs); a zero head gate and sparsity-shaped LayerNorms cut heads and
    the residual stream's channels, ``num_heads``, ``head_dim`` and ``hidden_dim`` follow, the
    cut is exact, and ``load_pruned`` gives a fresh instance the same network."""
    model = vit(seed)
    x = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        before = model(x)
    slimming.add_gates(model, torch.zeros(1, 3, 48, 48))
    attentions = [layer.self_attention for layer in model.encoder.layers]
    assert all(type(a) is MultiheadAttention for a in attentions)
    with torch.no_grad():
        assert rel_diff(model(x), before) < 1e-5
    sparse(model, seed)
    with torch.no_grad():
        for i, a in enumerate(attentions):
            a.out_proj.slimming_gate.weight.fill_(1.0)
            a.out_proj.slimming_gate.weight[(seed + i) % 4] = 0
    result = slimming.prune(model, percent=0.3, example_inputs=torch.zeros(1, 3, 48, 48), compensate=False)
    pruned = [layer.self_attention for layer in result.model.encoder.layers]
    assert [a.num_heads for a in pruned] == [3, 3]
    assert all(type(a) is MultiheadAttention for a in pruned)
    assert all(a.in_proj_weight.shape[0] == 3 * 3 * a.head_dim for a in pruned)
    width = int(result.masks["encoder.ln"].sum())
    assert result.model.hidden_dim == width < 32 and pruned[0].embed_dim == width
    with torch.no_grad():
        assert rel_diff(result.model(x), zeroed(model, result.masks)(x)) < 1e-5
    slimming.save_pruned(result.model, tmp_path / "vit.pt")
    fresh = slimming.load_pruned(tmp_path / "vit.pt", vit(seed + 10), example_inputs=x[:1])
    assert [layer.self_attention.num_heads for layer in fresh.encoder.layers] == [3, 3]
    assert all(type(layer.self_attention) is MultiheadAttention for layer in fresh.encoder.layers)
    with torch.no_grad():
        assert torch.allclose(fresh(x), result.model(x), atol=1e-6)


class Encoder(nn.Module):
    """A user's network on ``nn.TransformerEncoder`` (its layers normalise after the residual
    sum, torch's default): a convolution's map as tokens, normalised, padding masked out of the
    keys, a mean over the tokens, a classifier."""

    def __init__(self, dim: int = 32, heads: int = 4):
        super().__init__()
        self.stem, self.embed_norm = nn.Conv2d(3, dim, 4, stride=4), nn.LayerNorm(dim)
        layer = nn.TransformerEncoderLayer(dim, heads, dim_feedforward=64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 5)

    def forward(self, x):
        tokens = self.embed_norm(self.stem(x).flatten(2).transpose(1, 2))
        padding = torch.zeros(tokens.shape[:2], dtype=torch.bool, device=x.device)
        padding[:, -1] = True
        return self.fc(self.norm(self.encoder(tokens, src_key_padding_mask=padding)).mean(1))


@pytest.mark.parametrize("seed", [0, 1])
def test_a_transformer_encoder_of_your_own_is_cut_exactly(seed):
    """``nn.TransformerEncoderLayer`` runs torch's fused form in eval without autograd, which
    takes every width from ``embed_dim``: the pruned layers' attentions keep it away, and the
    pruned network equals the reference there too."""
    torch.manual_seed(seed)
    model = Encoder().eval()
    x = torch.zeros(1, 3, 16, 16)
    slimming.add_gates(model, x)
    sparse(model, seed)
    result = slimming.prune(model, percent=0.3, example_inputs=x, compensate=False)
    assert result.model.stem.out_channels < 32
    probe = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        assert rel_diff(result.model(probe), zeroed(model, result.masks)(probe)) < 1e-5


class Cross(nn.Module):
    """A cross-attention (queries from one stream, keys and values from another): torch's own
    forward, whose channels slimming does not follow; the convolutions before it are cut."""

    def __init__(self):
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                               nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16))
        self.b = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16))
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)
        self.fc = nn.Linear(16, 3)

    def forward(self, x):
        q, kv = (f(x).flatten(2).transpose(1, 2) for f in (self.a, self.b))
        return self.fc(self.attn(q, kv, kv)[0].mean(1))


def test_a_cross_attention_is_kept_whole_and_the_rest_is_cut():
    torch.manual_seed(0)
    model = Cross().eval()
    sparsity_shaped(model, 0)
    x = torch.zeros(1, 3, 8, 8)
    result = slimming.prune(model, percent=0.3, example_inputs=x, compensate=False)
    assert result.model.a[0].out_channels < 16  # the first block's inner channels
    assert type(result.model.attn) is nn.MultiheadAttention
    assert result.model.attn.in_proj_weight.shape == (48, 16)
    probe = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        assert rel_diff(result.model(probe), zeroed(model, result.masks)(probe)) < 1e-5
