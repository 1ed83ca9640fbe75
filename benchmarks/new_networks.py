"""Diffusion UNets, 3-D medical networks and dense-prediction transformers others wrote (issue
47): diffusers' UNet2DModel, UNet2DConditionModel (cross-attention) and AutoencoderKL, MONAI's
UNet (InstanceNorm without affine: gated, ``add_gates(everywhere=True)``), BasicUNet (affine
InstanceNorm) and SegResNet (GroupNorm), Hugging Face's DPT (gated: ``add_gates``) and Swin (as
it is, and gated); built small from their configs with random weights, sparsity-shaped factors
(seed 0), random betas, 30% of the channels by ``bn-mean`` (``--percent``), no compensation,
called as users call them
(``unet(x, t)``, ``unet(x, t, text_states)``). Prints the parameters cut, the check's figure,
the retries, and the largest relative difference against the original with the cut channels
zeroed on another input (other timesteps, batch 2; DPT at another size), or the one-line
refusal. Needs diffusers, MONAI and transformers (in ``[dev]``).

    python benchmarks/new_networks.py [--seeds 0,1,2] [--percent 0.3] [--only NAME]
"""

from __future__ import annotations

import warnings

import torch
from common import guarded, parser, sparsity_shaped
from network_table import output_of, rel_diff, with_statistics, zeroed

import slimming


def networks() -> dict:
    """name -> (builder, example inputs, other inputs to compare on, gates: False, "heads"
    (``add_gates``) or True (``everywhere=True``))."""
    import diffusers
    import transformers as hf
    from monai.networks import nets

    def unet2d():
        return diffusers.UNet2DModel(
            sample_size=16, in_channels=3, out_channels=3, layers_per_block=1, block_out_channels=(32, 64),
            norm_num_groups=8, down_block_types=("DownBlock2D", "AttnDownBlock2D"),
            up_block_types=("AttnUpBlock2D", "UpBlock2D"))

    def conditioned():
        return diffusers.UNet2DConditionModel(
            sample_size=16, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(32, 64),
            norm_num_groups=8, cross_attention_dim=32, attention_head_dim=8,
            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"))

    def vae():
        return diffusers.AutoencoderKL(
            in_channels=3, out_channels=3, block_out_channels=(32, 64), layers_per_block=1, latent_channels=4,
            norm_num_groups=8, down_block_types=("DownEncoderBlock2D",) * 2,
            up_block_types=("UpDecoderBlock2D",) * 2)

    def dpt():
        return hf.DPTForDepthEstimation(hf.DPTConfig(
            image_size=64, patch_size=16, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
            intermediate_size=128, backbone_out_indices=[0, 1, 2, 3], neck_hidden_sizes=[16, 32, 64, 64],
            fusion_hidden_size=32, reassemble_factors=[4, 2, 1, 0.5], head_in_index=-1))

    def swin():
        return hf.SwinForImageClassification(hf.SwinConfig(
            image_size=64, patch_size=4, embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=4,
            num_labels=5))

    g = torch.Generator().manual_seed(1)
    image, images = torch.zeros(1, 3, 64, 64), torch.randn(2, 3, 64, 64, generator=g)
    return {
        "diffusers UNet2DModel": (unet2d, (torch.zeros(1, 3, 16, 16), torch.tensor([10])),
                                  (torch.randn(2, 3, 16, 16, generator=g), torch.tensor([3, 900])), False),
        "diffusers UNet2DConditionModel": (
            conditioned, (torch.zeros(1, 4, 16, 16), torch.tensor([10]), torch.zeros(1, 7, 32)),
            (torch.randn(2, 4, 16, 16, generator=g), torch.tensor([3, 900]),
             torch.randn(2, 9, 32, generator=g)), False),
        "diffusers AutoencoderKL": (vae, (torch.zeros(1, 3, 32, 32),),
                                    (torch.randn(2, 3, 32, 32, generator=g),), False),
        "MONAI UNet (gated)": (
            lambda: nets.UNet(spatial_dims=3, in_channels=1, out_channels=2, channels=(8, 16, 32),
                              strides=(2, 2)),
            (torch.zeros(1, 1, 16, 16, 16),), (torch.randn(2, 1, 16, 16, 16, generator=g),), True),
        "MONAI BasicUNet": (
            lambda: nets.BasicUNet(spatial_dims=3, in_channels=1, out_channels=2,
                                   features=(8, 8, 16, 32, 64, 8)),
            (torch.zeros(1, 1, 32, 32, 32),), (torch.randn(2, 1, 32, 32, 32, generator=g),), False),
        "MONAI SegResNet": (
            lambda: nets.SegResNet(spatial_dims=3, in_channels=1, out_channels=2, init_filters=8),
            (torch.zeros(1, 1, 16, 16, 16),), (torch.randn(2, 1, 16, 16, 16, generator=g),), False),
        "Hugging Face DPT (gated)": (dpt, (image,), (torch.randn(2, 3, 96, 96, generator=g),), "heads"),
        "Hugging Face Swin": (swin, (image,), (images,), False),
        "Hugging Face Swin (gated)": (swin, (image,), (images,), "heads"),
    }


def sample(out):
    """A diffusers output's tensor (``.sample``), else the output itself."""
    return getattr(out, "sample", out)


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--seeds", default="0")
    p.add_argument("--percent", type=float, default=0.3, help="the share of the channels cut (0.3)")
    p.add_argument("--only", default="", help="the networks whose names contain this (all)")
    args = p.parse_args()
    for name, (build, example, other, gated) in networks().items():
        if args.only not in name:
            continue
        for seed in (int(s) for s in args.seeds.split(",")):
            torch.manual_seed(seed)
            model = build().eval()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if gated:
                    slimming.add_gates(model, example[0], everywhere=gated is True)
                sparsity_shaped(model, seed=seed)
                with_statistics(model, seed + 1)
                full = sum(t.numel() for t in model.parameters())
                try:
                    result = slimming.prune(model, percent=args.percent, importance="bn-mean",
                                            compensate=False,
                                            example_inputs=example if len(example) > 1 else example[0])
                except slimming.SlimmingError as e:
                    print(f"{name} seed {seed}: refused: {e}", flush=True)
                    continue
                with torch.no_grad():
                    diff = rel_diff(output_of(sample(result.model(*other))),
                                    output_of(sample(zeroed(model, result.masks)(*other))))
            cut = 1 - sum(t.numel() for t in result.model.parameters()) / full
            print(f"{name} seed {seed}: {100 * cut:.1f}% of {full} parameters cut, check "
                  f"{result.verified:.2g}, {len(result.retries)} retries, {diff:.2g} off on another input",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(guarded(main))
