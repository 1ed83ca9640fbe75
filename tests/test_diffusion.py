"""Diffusion UNets, called as users call them: ``unet(x, t)`` and ``unet(x, t, context)``, a
timestep of shape (N,) or a scalar beside the image (issue 47, items 1 and 2). The timestep has
no channels: what it becomes (its sinusoidal embedding, the MLP over it) is followed as values,
and each block's projection of it (``time_emb_proj``, added onto the feature map as (N, C, 1, 1))
is cut with the channels it meets. Written the way diffusers writes them (its ``Timesteps``,
``TimestepEmbedding`` and ``ResnetBlock2D``), and on diffusers' own classes where installed."""

import math
import warnings

import pytest
import torch
from conftest import rel_diff, sparsity_shaped, zeroed
from torch import nn

import slimming
from slimming.pruning.graph import GraphError


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """diffusers' ``get_timestep_embedding``: sines and cosines of the timestep at ``dim // 2``
    frequencies."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / half)
    args = t[:, None].float() * freqs[None]
    return torch.cat([torch.sin(args), torch.cos(args)], dim=-1)


class ResnetBlock(nn.Module):
    """diffusers' ``ResnetBlock2D``: the timestep's projection added between the convolutions."""

    def __init__(self, cin: int, cout: int, temb: int, groups: int = 4):
        super().__init__()
        self.norm1, self.conv1 = nn.GroupNorm(groups, cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.time_emb_proj = nn.Linear(temb, cout)
        self.norm2, self.conv2 = nn.GroupNorm(groups, cout), nn.Conv2d(cout, cout, 3, padding=1)
        self.shortcut = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x, temb):
        h = self.conv1(nn.functional.silu(self.norm1(x)))
        h = h + self.time_emb_proj(nn.functional.silu(temb))[:, :, None, None]
        h = self.conv2(nn.functional.silu(self.norm2(h)))
        return self.shortcut(x) + h


class CrossAttention(nn.Module):
    """Queries from the feature map, keys and values from the text states (N, L, D)."""

    def __init__(self, channels: int, context: int, groups: int = 4):
        super().__init__()
        self.norm = nn.GroupNorm(groups, channels)
        self.to_q, self.to_k = nn.Linear(channels, channels), nn.Linear(context, channels)
        self.to_v, self.to_out = nn.Linear(context, channels), nn.Linear(channels, channels)

    def forward(self, x, context):
        b, c, h, w = x.shape
        q = self.to_q(self.norm(x).flatten(2).transpose(1, 2))
        a = nn.functional.scaled_dot_product_attention(q, self.to_k(context), self.to_v(context), scale=1.0)
        return x + self.to_out(a).transpose(1, 2).reshape(b, c, h, w)


class TinyDiffusionUNet(nn.Module):
    """A two-level UNet as diffusers builds ``UNet2DModel``: the timestep's embedding through an
    MLP into every ResNet block; ``context``: a cross-attention on text states in the middle
    (``UNet2DConditionModel``)."""

    def __init__(self, channels=(16, 32), temb: int = 32, context: int | None = None):
        super().__init__()
        c0, c1 = channels
        self.temb = temb
        self.linear_1, self.linear_2 = nn.Linear(temb, 2 * temb), nn.Linear(2 * temb, temb)
        self.conv_in = nn.Conv2d(3, c0, 3, padding=1)
        self.down0, self.downsample = ResnetBlock(c0, c0, temb), nn.Conv2d(c0, c0, 3, 2, 1)
        self.mid = ResnetBlock(c0, c1, temb)
        self.attn = CrossAttention(c1, context) if context else None
        self.up0 = ResnetBlock(c1 + c0, c0, temb)
        self.norm_out, self.conv_out = nn.GroupNorm(4, c0), nn.Conv2d(c0, 3, 3, padding=1)

    def forward(self, sample, timestep, context=None):
        if timestep.dim() == 0:
            timestep = timestep[None]
        timestep = timestep * torch.ones(sample.shape[0], dtype=timestep.dtype)
        emb = self.linear_2(nn.functional.silu(self.linear_1(timestep_embedding(timestep, self.temb))))
        x = self.conv_in(sample)
        skip = self.down0(x, emb)
        x = self.mid(self.downsample(skip), emb)
        if self.attn is not None:
            x = self.attn(x, context)
        x = nn.functional.interpolate(x, scale_factor=2.0, mode="nearest")
        x = self.up0(torch.cat([x, skip], 1), emb)
        return self.conv_out(nn.functional.silu(self.norm_out(x)))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("conditioned", [False, True])
def test_a_diffusion_unet_called_with_its_timestep_is_cut_exactly_at_every_timestep(seed, conditioned):
    """Before: "the model's inputs are [(1, 3, 16, 16), (1,)]: slimming needs tensors with a
    channel dimension", and with the timestep fixed inside, "no channel can be cut" (the time
    embedding's add kept every block's channels). Now the blocks' channels are cut with the rows
    of the projection that meets them, and the network is exact at other timesteps, batches and
    text states than the example's; the MLP over the timestep (no factor scores it) stays."""
    torch.manual_seed(seed)
    model = TinyDiffusionUNet(context=8 if conditioned else None).eval()
    sparsity_shaped(model, seed)
    text = (torch.zeros(1, 5, 8),) if conditioned else ()
    example = (torch.zeros(1, 3, 16, 16), torch.tensor([10]), *text)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = slimming.prune(model, percent=0.3, example_inputs=example, compensate=False)
    small = result.model
    assert slimming.count_params(small) < 0.9 * slimming.count_params(model) and not result.retries
    cut = [b for b in ("down0", "mid", "up0") if small.get_submodule(b).time_emb_proj.out_features
           < model.get_submodule(b).time_emb_proj.out_features]
    assert cut  # rows of the timestep's projection went with their channels
    for b in ("down0", "mid", "up0"):
        assert small.get_submodule(b).time_emb_proj.out_features == small.get_submodule(b).conv1.out_channels
    assert small.linear_1.out_features == 64 and small.linear_2.out_features == 32
    reference = zeroed(model, result.masks)
    for t in (torch.tensor([3, 999]), torch.tensor([0.5, 250.0]), torch.tensor(42)):
        args = (torch.randn(2, 3, 16, 16), t, *((torch.randn(2, 7, 8),) if conditioned else ()))
        with torch.no_grad():
            assert rel_diff(small(*args), reference(*args)) < 1e-5, t


def test_a_scalar_timestep_in_the_example_and_a_flops_budget_work():
    """A 0-d timestep in ``example_inputs`` (diffusers accepts one); a FLOPs budget counts the
    network on the example's inputs as they are (it took a model of one input before)."""
    torch.manual_seed(0)
    model = TinyDiffusionUNet().eval()
    sparsity_shaped(model, 0)
    example = (torch.zeros(1, 3, 16, 16), torch.tensor(7))
    x, t = torch.randn(2, 3, 16, 16), torch.tensor([1, 500])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for amount in ({"percent": 0.3}, {"target_flops": 0.6}, {"target_params": 0.7}):
            result = slimming.prune(model, example_inputs=example, compensate=False, **amount)
            with torch.no_grad():
                assert rel_diff(result.model(x, t), zeroed(model, result.masks)(x, t)) < 1e-5
    budget = result.budget  # the parameters' budget, met
    assert budget.met and budget.achieved <= 0.7 * budget.full
    flops = slimming.prune(model, target_flops=0.6, example_inputs=example, compensate=False).budget
    assert flops.met and flops.achieved <= 0.6 * flops.full < flops.full
    assert flops.full == slimming.measure.stats.count_flops(model, inputs=example)


def test_inputs_without_any_channel_dimension_are_still_one_line():
    """Only what carries channels is followed, and there must be one such input."""
    model = TinyDiffusionUNet().eval()
    with pytest.raises(GraphError, match="needs a tensor with a channel dimension") as e:
        slimming.prune(model, percent=0.3, example_inputs=(torch.tensor([1.0]), torch.tensor([10])))
    assert "\n" not in str(e.value)


class ScaleShiftBlock(nn.Module):
    """diffusers' ``ResnetBlock2D`` with ``time_embedding_norm="scale_shift"`` (AdaGN): the
    projection gives a scale and a shift of the normalised map, ``norm2(h) * (1 + scale) +
    shift``, after the factor that scores those channels."""

    def __init__(self, cin: int, cout: int, temb: int, groups: int = 4):
        super().__init__()
        self.norm1, self.conv1 = nn.GroupNorm(groups, cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.time_emb_proj = nn.Linear(temb, 2 * cout)
        self.norm2, self.conv2 = nn.GroupNorm(groups, cout), nn.Conv2d(cout, cout, 3, padding=1)
        self.shortcut = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x, temb):
        h = self.conv1(nn.functional.silu(self.norm1(x)))
        scale, shift = self.time_emb_proj(nn.functional.silu(temb))[:, :, None, None].chunk(2, dim=1)
        h = self.conv2(nn.functional.silu(self.norm2(h) * (1 + scale) + shift))
        return self.shortcut(x) + h


class FiLMNet(nn.Module):
    """Blocks modulated by what another input became: a timestep's embedding through an MLP
    (a diffusion UNet's AdaGN), or a class label's (``nn.Embedding``: FiLM's conditioning)."""

    def __init__(self, by: str, c: int = 16, temb: int = 32):
        super().__init__()
        self.by, self.temb = by, temb
        self.embed = nn.Embedding(10, temb) if by == "label" else nn.Linear(temb, temb)
        self.conv_in = nn.Conv2d(3, c, 3, padding=1)
        self.b1, self.b2 = ScaleShiftBlock(c, 2 * c, temb), ScaleShiftBlock(2 * c, 2 * c, temb)
        self.out = nn.Sequential(nn.GroupNorm(4, 2 * c), nn.SiLU(), nn.Conv2d(2 * c, 3, 3, padding=1))

    def forward(self, x, t):
        e = self.embed(t) if self.by == "label" else self.embed(timestep_embedding(t, self.temb))
        return self.out(self.b2(self.b1(self.conv_in(x), e), e))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("by", ["timestep", "label"])
def test_a_scale_and_shift_from_another_input_are_cut_with_the_channels_they_meet(by, seed):
    """Issue 47, item 2: FiLM and AdaGN's ``norm(h) * (1 + scale) + shift``, both from a
    projection of what another input became. A cut channel's scale and shift rows go with it
    (zeroed in the reference, ``result.masks``, as its gamma and beta are), so the norms before
    them are cut (before, the shift kept every such channel); exact against the zeroed original
    at other inputs, compensated or not."""
    torch.manual_seed(seed)
    model = FiLMNet(by).eval()
    sparsity_shaped(model, seed)
    t = torch.tensor([3]) if by == "label" else torch.tensor([10])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = slimming.prune(model, percent=0.3, example_inputs=(torch.zeros(1, 3, 16, 16), t),
                                compensate=False)
        compensated = slimming.prune(model, percent=0.3, example_inputs=(torch.zeros(1, 3, 16, 16), t))
    assert any(result.cfg[f"{b}.norm2"] < 32 for b in ("b1", "b2"))  # cut, the shift notwithstanding
    for block in ("b1", "b2"):
        keep = result.masks[f"{block}.norm2"]
        rows = result.masks.get(f"{block}.time_emb_proj", torch.ones(64, dtype=torch.bool))  # there where cut
        assert torch.equal(rows, torch.cat([keep, keep]))  # its scale's and its shift's
        assert getattr(result.model, block).time_emb_proj.out_features == 2 * int(keep.sum())
    ts = torch.tensor([1, 7]) if by == "label" else torch.tensor([3, 900])
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert rel_diff(result.model(x, ts), zeroed(model, result.masks)(x, ts)) < 1e-5
        assert compensated.model(x, ts).shape == (2, 3, 16, 16)
    assert slimming.count_params(result.model) < 0.85 * slimming.count_params(model)


DIFFUSERS = {
    "UNet2DModel": lambda d: (d.UNet2DModel(
        sample_size=16, in_channels=3, out_channels=3, layers_per_block=1, block_out_channels=(32, 64),
        norm_num_groups=8, down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D")), (torch.zeros(1, 3, 16, 16), torch.tensor([10]))),
    "UNet2DModel scale_shift": lambda d: (d.UNet2DModel(  # AdaGN: the timestep's scale and shift
        sample_size=16, in_channels=3, out_channels=3, layers_per_block=1, block_out_channels=(32, 64),
        norm_num_groups=8, down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"), resnet_time_scale_shift="scale_shift"),
        (torch.zeros(1, 3, 16, 16), torch.tensor([10]))),
    "UNet2DConditionModel": lambda d: (d.UNet2DConditionModel(
        sample_size=16, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(32, 64),
        norm_num_groups=8, cross_attention_dim=32, attention_head_dim=8,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D")),
        (torch.zeros(1, 4, 16, 16), torch.tensor([10]), torch.zeros(1, 7, 32))),
}


@pytest.mark.parametrize("name", list(DIFFUSERS))
def test_diffusers_own_unets_are_cut_exactly(name):
    """diffusers' ``UNet2DModel`` and ``UNet2DConditionModel`` (cross-attention included), as
    users call them (``unet(x, t)``, ``unet(x, t, text_states)``), their outputs (a
    ``UNet2DOutput``) kept whole: at least 15% of the parameters cut, exact at other timesteps."""
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    unet, example = DIFFUSERS[name](diffusers)
    unet = unet.eval()
    sparsity_shaped(unet, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = slimming.prune(unet, percent=0.3, example_inputs=example, compensate=False)
    assert slimming.count_params(result.model) < 0.85 * slimming.count_params(unet) and not result.retries
    reference = zeroed(unet, result.masks)
    args = (torch.randn(2, *example[0].shape[1:]), torch.tensor([3, 900]),
            *((torch.randn(2, 9, 32),) if len(example) == 3 else ()))
    with torch.no_grad():
        assert rel_diff(result.model(*args).sample, reference(*args).sample) < 1e-5


class KeywordOnly(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.norm = nn.Conv2d(3, 8, 3, padding=1), nn.GroupNorm(4, 8)

    def forward(self, x, *, scale=1.0):
        return self.norm(self.conv(x)) * scale


def test_example_inputs_as_the_forwards_keyword_arguments():
    """Issue 47, item 1: ``example_inputs`` as a dict of the forward's keyword arguments
    (Torch-Pruning's and Hugging Face's way) is bound to its signature: the same cut as the tuple,
    exact; a name the forward does not take, or takes only by keyword, is one line."""
    torch.manual_seed(0)
    model = TinyDiffusionUNet(context=8).eval()
    sparsity_shaped(model, 0)
    x, t, text = torch.zeros(1, 3, 16, 16), torch.tensor([10]), torch.zeros(1, 5, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        by_name = slimming.prune(model, percent=0.3, compensate=False,
                                 example_inputs={"sample": x, "timestep": t, "context": text})
        by_place = slimming.prune(model, percent=0.3, compensate=False, example_inputs=(x, t, text))
    assert all(torch.equal(m, by_place.masks[k]) for k, m in by_name.masks.items())
    args = (torch.randn(2, 3, 16, 16), torch.tensor([4, 800]), torch.randn(2, 6, 8))
    with torch.no_grad():
        assert rel_diff(by_name.model(*args), zeroed(model, by_name.masks)(*args)) < 1e-5
    for bad, said in (({"sample": x, "noise": t}, "does not take these keyword arguments"),
                      ({"x": x, "scale": 2.0}, "scale can be given only by keyword")):
        target = model if "noise" in bad else KeywordOnly().eval()
        with pytest.raises(slimming.SlimmingError, match=said) as e:
            slimming.prune(target, percent=0.3, example_inputs=bad)
        assert "\n" not in str(e.value) and e.value.params == ("example_inputs",)


class OneHeadAttention(nn.Module):
    """diffusers' ``Attention`` with its ``AttnProcessor2_0``, as AutoencoderKL's mid-block has
    it: one head, a GroupNorm inside, and the head's width read off the keys' shape
    (``key.shape[-1] // attn.heads``), not held by the module."""

    def __init__(self, channels: int, groups: int = 4):
        super().__init__()
        self.heads = 1
        self.group_norm = nn.GroupNorm(groups, channels)
        self.to_q, self.to_k, self.to_v = (nn.Linear(channels, channels) for _ in range(3))
        self.to_out = nn.ModuleList([nn.Linear(channels, channels), nn.Dropout(0.0)])

    def forward(self, hidden_states):
        residual = hidden_states
        batch_size, channel, height, width = hidden_states.shape
        hidden_states = hidden_states.view(batch_size, channel, height * width).transpose(1, 2)
        hidden_states = self.group_norm(hidden_states.transpose(1, 2)).transpose(1, 2)
        query, key, value = self.to_q(hidden_states), self.to_k(hidden_states), self.to_v(hidden_states)
        head_dim = key.shape[-1] // self.heads
        query, key, value = (t.view(batch_size, -1, self.heads, head_dim).transpose(1, 2)
                             for t in (query, key, value))
        hidden_states = nn.functional.scaled_dot_product_attention(query, key, value)
        hidden_states = hidden_states.transpose(1, 2).reshape(batch_size, -1, self.heads * head_dim)
        hidden_states = self.to_out[1](self.to_out[0](hidden_states))
        hidden_states = hidden_states.transpose(-1, -2).reshape(batch_size, channel, height, width)
        return hidden_states + residual


class TinyVAEEncoder(nn.Module):
    """AutoencoderKL's encoder in small: a convolution, a ResNet block, the one-head attention."""

    def __init__(self):
        super().__init__()
        self.conv_in = nn.Conv2d(3, 16, 3, padding=1)
        self.norm1, self.conv1 = nn.GroupNorm(4, 16), nn.Conv2d(16, 24, 3, padding=1)
        self.norm2, self.conv2 = nn.GroupNorm(4, 24), nn.Conv2d(24, 16, 3, padding=1)
        self.attention = OneHeadAttention(16)
        self.norm_out, self.conv_out = nn.GroupNorm(4, 16), nn.Conv2d(16, 8, 3, padding=1)

    def forward(self, x):
        x = self.conv_in(x)
        h = self.conv2(nn.functional.silu(self.norm2(self.conv1(nn.functional.silu(self.norm1(x))))))
        x = self.attention(x + h)
        return self.conv_out(nn.functional.silu(self.norm_out(x)))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_an_attention_that_reads_its_head_width_off_the_keys_is_cut_at_once(seed):
    """The values' channels sized by the keys' width (``value.view(B, -1, heads, key.shape[-1] //
    heads)``) are tied to the keys': one cut, never the one that fails and the gates kept whole
    after it (AutoencoderKL, issue 44); the attention's widths agree, the gates elsewhere cut."""
    torch.manual_seed(seed)
    model = TinyVAEEncoder().eval()
    x = torch.zeros(1, 3, 8, 8)
    slimming.add_gates(model, x)
    sparsity_shaped(model, seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = slimming.prune(model, percent=0.3, example_inputs=x, compensate=False)
    assert result.retries == []
    attention = result.model.attention
    assert attention.to_v.out_features == attention.to_k.out_features == attention.to_q.out_features
    assert result.model.conv1.out_channels < 24  # the sparse gates and norms still cut
    inputs = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        assert rel_diff(result.model(inputs), zeroed(model, result.masks)(inputs)) < 1e-5
