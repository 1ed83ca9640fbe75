"""Layers called with tensors their forward computes from parameters (issue 34's fourth class),
and attentions that reshape by a width read off their input's shape.

A query-key-value projection's bias made in the forward as EVA, BEiT and timm's Swin-v2 make
it (``torch.cat((self.q_bias, self.k_bias, self.v_bias))``, ``k_bias`` a buffer of zeros), or
as torchvision's Swin-v2 does (``self.qkv.bias.clone()`` with the keys' third zeroed in place):
each row of the bias is one row of a parameter, so those parameters are cut row for row with
the projection's output channels, heads included. A bias whose rows are mixed (flipped, or
written over by other rows) is not followed: that layer's outputs are kept.

``reshape(B, N, C)`` after the heads with ``C`` read off the input's shape (EVA, BEiT), or
``reshape(B, N, 3, heads, C // heads)`` (torchvision's Swin): the cut cannot set those sizes, so
the attention keeps its channels and heads from the start, without a failed check and a retry.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from conftest import refiled, rel_diff, sparsity_shaped, zeroed
from torch import nn

import slimming

DIM, HEADS = 32, 4


class BiasAttention(nn.Module):
    """An attention whose projection's bias is computed in the forward, by ``how``: ``cat`` (a
    query and a value bias around a buffer of zeros), ``clone`` (its own bias, the keys' third
    zeroed in place), ``flip`` (a cat reversed: rows moved) or ``copied`` (a clone with some
    rows written over by others). ``from_shape``: heads merged to the width read off the input."""

    def __init__(self, how: str = "cat", from_shape: bool = False, holds_dim: bool = False):
        super().__init__()
        self.how, self.from_shape = how, from_shape
        self.num_heads, self.head_dim = HEADS, DIM // HEADS
        if holds_dim:  # timm's PVT-v2: the input's width held too, the merge still by C
            self.dim = DIM
        if not from_shape:  # EVA and BEiT hold no width of the merged heads
            self.attn_dim = DIM
        self.qkv = nn.Linear(DIM, 3 * DIM, bias=how in ("clone", "copied"))
        if self.qkv.bias is None:
            self.q_bias = nn.Parameter(torch.randn(DIM))
            self.register_buffer("k_bias", torch.zeros(DIM))
            self.v_bias = nn.Parameter(torch.randn(DIM))
        self.proj = nn.Linear(DIM, DIM)

    def bias(self) -> torch.Tensor:
        if self.qkv.bias is None:
            bias = torch.cat((self.q_bias, self.k_bias, self.v_bias))
            return bias.flip(0) if self.how == "flip" else bias
        bias = self.qkv.bias.clone()
        n = bias.numel() // 3
        bias[n:2 * n].zero_()
        if self.how == "copied":
            bias[:4] = self.qkv.bias[-4:]
        return bias

    def forward(self, x):
        B, N, C = x.shape
        self.seen = C  # a width the forward keeps (the trace leaves a plain int here)
        qkv = F.linear(x, self.qkv.weight, self.bias())
        q, k, v = qkv.reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        x = F.scaled_dot_product_attention(q, k, v).transpose(1, 2)
        return self.proj(x.reshape(B, N, C if self.from_shape else self.attn_dim))


class TokenNet(nn.Module):
    """Tokens (B, N, 12) embedded, a pre-norm attention and MLP with residuals, a head."""

    def __init__(self, **attention):
        super().__init__()
        self.embed, self.norm1, self.norm2 = nn.Linear(12, DIM), nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.attn, self.head = BiasAttention(**attention), nn.Linear(DIM, 5)
        self.fc1, self.fc2, self.norm3 = nn.Linear(DIM, 2 * DIM), nn.Linear(2 * DIM, DIM), nn.LayerNorm(DIM)

    def forward(self, x):
        x = self.embed(x)
        x = x + self.attn(self.norm1(x))
        x = x + self.fc2(F.gelu(self.fc1(self.norm2(x))))
        return self.head(self.norm3(x).mean(1))


def gated_cut(model: nn.Module, x: torch.Tensor, seed: int = 0, off: str | None = None):
    """Gates, sparsity-shaped factors (the gate ``off`` near zero on its second head), a 30%
    cut without compensation (checked), and the pruned network against the original with the
    cut channels zeroed on another input."""
    slimming.add_gates(model, x)
    sparsity_shaped(model, seed)
    if off is not None:
        with torch.no_grad():
            model.get_submodule(off).weight[1] = 1e-4
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        result = slimming.prune(model, percent=0.3, example_inputs=x, compensate=False)
    probe = torch.randn(3, *x.shape[1:], generator=torch.Generator().manual_seed(seed + 1))
    with torch.no_grad():
        assert rel_diff(result.model(probe), zeroed(model, result.masks)(probe)) < 1e-5
    return result, [str(w.message) for w in said]


@pytest.mark.parametrize("how", ["cat", "clone"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_bias_made_row_by_row_of_parameters_is_cut_with_the_heads(how, seed):
    """Before, 'a layer whose tensors are not one module's parameters' kept every channel of
    the projection: no head and no channel of a head was cut."""
    torch.manual_seed(seed)
    model = TokenNet(how=how).eval()
    result, said = gated_cut(model, torch.randn(1, 10, 12), seed, off="attn.proj.slimming_gate")
    assert not [s for s in said if "not one module's parameters" in s or "did not match" in s]
    attn = result.model.attn
    assert attn.num_heads < HEADS and attn.qkv.out_features == 3 * attn.num_heads * attn.head_dim
    rows = [attn.qkv.bias] if how == "clone" else [attn.q_bias, attn.k_bias, attn.v_bias]
    assert sum(t.numel() for t in rows) == attn.qkv.out_features
    assert not result.retries


@pytest.mark.parametrize("how", ["flip", "copied"])
def test_a_bias_whose_rows_are_mixed_keeps_the_projection(how):
    """Rows moved (a flip) or written over by other rows: a row of the bias is not one row of a
    parameter, so the projection's outputs are kept, and the rest is still cut exactly."""
    torch.manual_seed(0)
    model = TokenNet(how=how).eval()
    result, said = gated_cut(model, torch.randn(1, 10, 12))
    assert result.model.attn.qkv.out_features == 3 * DIM and result.model.attn.num_heads == HEADS
    assert any("not one module's parameters" in s for s in said)
    assert result.model.fc1.out_features < 2 * DIM  # the MLP is still cut


@pytest.mark.parametrize("holds_dim", [False, True])
def test_heads_merged_to_a_width_read_off_the_input_are_kept_without_a_retry(holds_dim):
    """EVA's and BEiT's ``reshape(B, N, C)``, ``C`` the input's: a head cut would give fewer
    channels than ``C``. Before, the cut was tried, the check refused it and prune retried with
    the attention kept; now it is kept from the start (the same cut, one check). ``holds_dim``:
    the module also holds that width as an attribute (``self.dim``, timm's PVT-v2), which the
    merge does not read: before, the equal number was taken for the attribute and retried.
    The width the forward stored (``self.seen``) is the plain int it was after the trace."""
    torch.manual_seed(0)
    model = TokenNet(how="cat", from_shape=True, holds_dim=holds_dim).eval()
    model(torch.randn(1, 10, 12))  # sets attn.seen, as any forward would
    result, said = gated_cut(model, torch.randn(1, 10, 12))
    assert not result.retries and not [s for s in said if "did not match" in s]
    attn = result.model.attn
    assert attn.qkv.out_features == 3 * DIM and attn.num_heads == HEADS and attn.q_bias.numel() == DIM
    assert result.model.embed.out_features == DIM  # C is the input's width: the stream is kept too
    assert type(model.attn.seen) is int and type(result.model.attn.seen) is int


@pytest.mark.parametrize("name", ["eva02_tiny_patch14_224", "beit_base_patch16_224"])
def test_timm_attentions_with_a_computed_bias_are_cut_in_one_check(name):
    """timm's EVA-02 and BEiT (a q/v bias cat, the heads merged to the input's width): exact,
    with no retry (before: every attention's bias kept 'a layer whose tensors are not one
    module's parameters')."""
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    options = {"img_size": 56, "num_classes": 5}
    if name.startswith("beit"):
        options.update(depth=2, embed_dim=64, num_heads=2)
    else:
        options.update(depth=2)
    model = timm.create_model(name, pretrained=False, **options).eval()
    result, said = gated_cut(model, torch.randn(1, 3, 56, 56))
    assert not result.retries
    assert not [s for s in said if "not one module's parameters" in s or "did not match" in s]
    assert sum(p.numel() for p in result.model.parameters()) < sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", ["pvt_v2_b0", "twins_pcpvt_small"])
def test_timm_pyramid_attentions_merged_by_the_input_width_are_cut_in_one_check(name):
    """timm's PVT-v2 and Twins-PCPVT read ``B, N, C = x.shape`` and merge their heads to ``C``,
    which their ``dim`` attribute equals: exact, with no retry (before: a failed check and a
    second trace and check, 3.5x Torch-Pruning's time on pvt_v2_b0, RESULTS.md)."""
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, num_classes=5, depths=(1, 1, 1, 1)).eval()
    result, said = gated_cut(model, torch.randn(1, 3, 64, 64))
    assert not result.retries and not [s for s in said if "did not match" in s]
    assert sum(p.numel() for p in result.model.parameters()) < sum(p.numel() for p in model.parameters())


def test_timm_tiny_vit_heads_merged_to_a_side_named_width_are_cut_in_one_check():
    """timm's TinyViT merges its heads with ``reshape(B, N, self.out_dim)``, and ``out_dim``
    (named as if the module's output) equals the residual stream's width: the attribute is the
    merged heads' width, as the forward reads it, so a cut of the stream runs and is exact (before:
    ``out_dim`` set to the stream's new width, the check refused it twice, then every
    ``Attention`` was kept whole: 3.07x Torch-Pruning's time, RESULTS.md)."""
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model("tiny_vit_5m_224", pretrained=False, num_classes=5, depths=(1, 1, 1, 1),
                              window_sizes=(4, 4, 4, 2)).eval()
    result, said = gated_cut(model, torch.randn(1, 3, 64, 64))
    assert not result.retries and not [s for s in said if "did not" in s]
    attns = [n for n, m in result.model.named_modules() if type(m).__name__ == "Attention"]
    pruned = [result.model.get_submodule(n) for n in attns]
    assert pruned and all(m.out_dim == m.proj.in_features for m in pruned)
    # the stream the attention reads and writes is cut: out_dim, which equalled it, is not
    assert any(result.model.get_submodule(n).proj.out_features < model.get_submodule(n).proj.out_features
               for n in attns)


class OneGroupNormNet(nn.Module):
    """A norm over every channel as ``nn.GroupNorm(1, C)`` (timm's GroupNorm1, PoolFormer's) on
    a stream a BatchNorm scores too, beside a hidden width a BatchNorm scores."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16))
        self.norm = nn.GroupNorm(1, 16)
        self.hidden = nn.Sequential(nn.Conv2d(16, 32, 1), nn.BatchNorm2d(32), nn.ReLU(), nn.Conv2d(32, 16, 1),
                                    nn.BatchNorm2d(16))
        self.head = nn.Linear(16, 5)

    def forward(self, x):
        x = self.stem(x)
        x = x + self.hidden(self.norm(x))
        return self.head(x.mean((2, 3)))


def test_a_group_norm_of_one_group_keeps_its_channels_from_the_start():
    """A GroupNorm of one group normalises each channel by all of them: its channels are kept
    from the first trace, and the rest is cut exactly with no retry (before: the cut left it
    ``num_groups`` 0, the pruned network failed, and every GroupNorm was kept on a second cut)."""
    torch.manual_seed(0)
    model = OneGroupNormNet().eval()
    sparsity_shaped(model, 0)
    with torch.no_grad():
        for norm in (model.stem[1], model.norm, model.hidden[4]):  # the stream's gammas want a cut
            norm.weight[:6] = 1e-4
    x = torch.randn(2, 3, 16, 16)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        result = slimming.prune(model, percent=0.3, example_inputs=x, compensate=False)
    assert not result.retries and not [w for w in said if "did not" in str(w.message)]
    assert result.model.norm.num_channels == 16 and result.model.norm.num_groups == 1
    assert result.model.hidden[1].num_features < 32
    with torch.no_grad():
        assert rel_diff(result.model(x), zeroed(model, result.masks)(x)) < 1e-5


def test_timm_poolformer_group_norms_of_one_group_are_kept_from_the_start():
    """timm's PoolFormer (MetaFormer with GroupNorm1 norms, 3.29x Torch-Pruning's time before,
    RESULTS.md): one cut, exact, its norms whole and the MLPs cut."""
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.models.metaformer.MetaFormer(
        depths=(1, 1, 1, 1), dims=(16, 32, 48, 64), num_classes=5, norm_layers=timm.layers.GroupNorm1,
        downsample_norm=None, mlp_act=nn.GELU, mlp_bias=True, use_mlp_head=False,
        layer_scale_init_values=1e-5, res_scale_init_values=None).eval()
    result, said = gated_cut(model, torch.randn(1, 3, 32, 32))
    assert not result.retries and not [s for s in said if "did not" in s]
    norms = [n for n, m in model.named_modules() if isinstance(m, nn.GroupNorm)]
    assert norms and all(result.model.get_submodule(n).num_channels == model.get_submodule(n).num_channels
                         for n in norms)
    assert sum(p.numel() for p in result.model.parameters()) < sum(p.numel() for p in model.parameters())


def test_torchvision_swin_reshape_by_the_input_width_is_kept_without_a_retry():
    """torchvision's Swin splits its heads by ``C // num_heads``, ``C`` the block's input width:
    its attentions keep their channels from the start (before: a failed check, then every
    ``ShiftedWindowAttention`` kept whole by the retry)."""
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[1, 1],
                                               num_heads=[2, 4], window_size=[4, 4], num_classes=5).eval()
    result, said = gated_cut(model, torch.randn(1, 3, 32, 32))
    assert not result.retries and not [s for s in said if "did not match" in s]


class LooseKeyBias(BiasAttention):
    """EVA's and timm Swin-v2's ``k_bias``: a buffer kept out of the state_dict
    (``persistent=False``), which the cut narrows with the heads."""

    def __init__(self):
        super().__init__("cat")
        del self._buffers["k_bias"]
        self.register_buffer("k_bias", torch.zeros(DIM), persistent=False)


class LooseNet(TokenNet):
    def __init__(self):
        super().__init__()
        self.attn = LooseKeyBias()


def test_a_narrowed_buffer_outside_the_state_dict_is_saved_and_loaded(tmp_path):
    """Before, ``save_pruned`` wrote the state_dict alone: the narrowed ``k_bias`` was lost and
    ``load_pruned`` refused the file ('the loaded widths do not fit each other'). Now buffers
    outside the state_dict travel in the file, are checked like the weights, and a fresh
    instance computes what the pruned network does; a forged one is refused in one line."""
    from slimming.errors import CheckpointError

    torch.manual_seed(0)
    result, _ = gated_cut(LooseNet().eval(), torch.randn(1, 10, 12), off="attn.proj.slimming_gate")
    assert result.model.attn.k_bias.numel() < DIM
    path = tmp_path / "pruned.pth"
    slimming.save_pruned(result.model, path)
    loaded = slimming.load_pruned(path, LooseNet())
    x = torch.randn(2, 10, 12)
    with torch.no_grad():
        assert torch.equal(loaded(x), result.model(x))
    blob = torch.load(path, weights_only=True)
    forgeries = ({"attn.q_bias": torch.zeros(4)}, {"attn.k_bias": torch.zeros(2 * DIM)}, {"attn.k_bias": 3})
    for forged in forgeries:
        refiled(blob, tmp_path / "forged.pth", buffers=forged)
        fresh = LooseNet()
        with pytest.raises(CheckpointError, match="buffer|wider|named tensors"):
            slimming.load_pruned(tmp_path / "forged.pth", fresh)
        assert fresh.attn.k_bias.shape == (DIM,)


class PositionBiasAttention(nn.Module):
    """timm's Swin-v2 attention in small: a per-head bias made by an MLP run on fixed
    coordinates (``cpb_mlp``, its last layer one output per head), added to the attention map;
    widths held (``num_heads``, ``head_dim``, ``attn_dim``)."""

    def __init__(self, tokens: int = 10):
        super().__init__()
        self.num_heads, self.head_dim, self.attn_dim = HEADS, DIM // HEADS, DIM
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.cpb_mlp = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, HEADS))
        self.register_buffer("coords", torch.randn(tokens * tokens, 2))

    def forward(self, x):
        B, N, _ = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        bias = self.cpb_mlp(self.coords).view(N, N, self.num_heads).permute(2, 0, 1)
        attn = ((q @ k.transpose(-2, -1)) * self.head_dim ** -0.5 + bias).softmax(-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(B, N, self.attn_dim))


def test_a_per_head_bias_from_an_mlp_on_fixed_coordinates_is_cut_with_the_heads():
    """The MLP's last layer gives one value per head; when heads go, its rows go with them
    (before, the cut left it giving as many values as there were heads, and the network did not
    run after a head cut)."""
    torch.manual_seed(0)
    model = TokenNet()
    model.attn = PositionBiasAttention()
    model.eval()
    result, said = gated_cut(model, torch.randn(1, 10, 12), off="attn.proj.slimming_gate")
    attn = result.model.attn
    assert attn.num_heads < HEADS and attn.cpb_mlp[2].out_features == attn.num_heads
    assert not result.retries and not [s for s in said if "did not match" in s]
