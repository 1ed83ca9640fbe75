"""verify=False cuts what the checked call cuts (issue 44, item 8) on Hugging Face networks that
merge their heads by an attribute they hold (``all_head_size``): Swin-v2, YOLOS, MobileViT,
built small from their configs with random weights, and the three timm networks the issue
named (``vitamin_small_224``, ``csatv2``, ``hiera_tiny_224``, at their own input sizes,
``--timm``), gates per head and per MLP width
(``add_gates``), sparsity-shaped factors (seed 0), 30% of the channels, no compensation. Prints,
checked and unchecked, the share of the parameters cut and the retries, and how many factor
layers' masks differ. Needs ``transformers`` (not a dependency: pip install transformers).

    python benchmarks/unchecked_cuts.py [--seeds 0,1,2] [--timm]
"""

from __future__ import annotations

import warnings

import torch
from common import guarded, parser, sparsity_shaped
from torch import nn

import slimming


def networks() -> dict:
    import transformers as T
    side = torch.zeros(1, 3, 64, 64)
    return {
        "Swinv2ForImageClassification": lambda: T.Swinv2ForImageClassification(T.Swinv2Config(
            image_size=64, patch_size=4, embed_dim=32, depths=[2, 2], num_heads=[2, 4], window_size=4,
            num_labels=10)),
        "YolosForObjectDetection": lambda: T.YolosForObjectDetection(T.YolosConfig(
            image_size=[64, 64], patch_size=16, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=128, num_detection_tokens=10)),
        "MobileViTForImageClassification": lambda: T.MobileViTForImageClassification(T.MobileViTConfig(
            image_size=64, num_labels=10, hidden_sizes=[32, 48, 64],
            neck_hidden_sizes=[8, 8, 16, 24, 32, 40, 64])),
    }, side


def timm_networks() -> dict:
    """name -> (builder, example) for the timm networks the issue named."""
    import timm
    out = {}
    for n in ("vitamin_small_224", "csatv2", "hiera_tiny_224"):
        cfg = timm.models.get_pretrained_cfg(n)
        out[f"timm {n}"] = (lambda n=n: timm.create_model(n, pretrained=False, num_classes=10),
                            torch.zeros(1, *cfg.input_size))
    return out


class Logits(nn.Module):
    """The network called on pixels, its first output (logits) as the output."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x):
        out = self.model(pixel_values=x)
        return out.logits if hasattr(out, "logits") else out[0]


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--seeds", default="0")
    p.add_argument("--timm", action="store_true", help="the timm networks instead")
    args = p.parse_args()
    if args.timm:
        found = timm_networks()
    else:
        builds, side = networks()
        found = {name: (lambda b=build: Logits(b()), side) for name, build in builds.items()}
    for name, (build, x) in found.items():
        for seed in (int(s) for s in args.seeds.split(",")):
            torch.manual_seed(seed)
            model = build().eval()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                slimming.add_gates(model, x)
                sparsity_shaped(model, seed=seed)
                full = sum(t.numel() for t in model.parameters())
                got = {verify: slimming.prune(model, percent=0.3, example_inputs=x, verify=verify,
                                              compensate=False) for verify in (True, False)}
            cut = {v: 1 - sum(t.numel() for t in r.model.parameters()) / full for v, r in got.items()}
            differ = sum(not torch.equal(m, got[False].masks[k]) for k, m in got[True].masks.items())
            print(f"{name} seed {seed}: checked {100 * cut[True]:.1f}% cut, "
                  f"{len(got[True].retries)} retries; "
                  f"unchecked {100 * cut[False]:.1f}%, {len(got[False].retries)} retries; "
                  f"{differ} of {len(got[True].masks)} masks differ", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(guarded(main))
