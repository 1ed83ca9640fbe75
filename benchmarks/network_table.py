"""slimming and Torch-Pruning on many networks nobody here wrote (torchvision classifiers,
segmentation, detection and video models, timm classifiers, segmentation-models-pytorch
decoders) and our own YOLO-style detectors (with and without C2PSA attention), at one rule: one
global ranking of BatchNorm |gamma| (a group's channels scored by the mean over its
BatchNorms), 30% of the channels removed, the outputs (classifier, segmentation logits,
detection head) kept.

For each network, on random sparsity-shaped gammas: the parameters each tool cut; whether each
pruned network runs and is exact (its outputs equal the original's with the cut channels'
gamma and beta zeroed, max relative difference under 1e-4; for detectors whose outputs pass
through non-maximum suppression, slimming's own check, module by module); the in-process prune
time of each (median of interleaved runs in one process; slimming's without its check and with
it, the default; Torch-Pruning's including the copy it needs to leave the model intact; the
garbage of each run collected before the next, so that neither pays for the other's); and what
slimming's check costs, in forwards of the original at the example's size. Torch-Pruning is
installed for this benchmark only (``pip install torch-pruning``); it is never a dependency of
slimming.

    python benchmarks/network_table.py [--size 224] [--repeats 3] [--only resnet50,...]
        [--out runs/network_table.json]

``--section new``: diffusers' AutoencoderKL and MONAI's 3-D UNet, BasicUNet and SegResNet, by
the transformers section's routes.

``--section transformers``: transformers, hybrids and networks without normalisation (timm,
torchvision, segmentation-models-pytorch on Mix-Transformer encoders), each tool by its
documented route for them. slimming: ``add_gates`` (a gate per head and before each MLP's second
layer; every width, ``everywhere=True``, where no normalisation scores any), the gates
sparsity-shaped like the norms' gammas, then the same prune. Torch-Pruning: its ViT example's
settings (``MetaPruner``, ``num_heads`` of every module holding a ``qkv`` linear and
``num_heads``, the classifier ignored) ranking channels by the |gamma| of every norm
(BatchNorm, LayerNorm, GroupNorm: ``GroupMagnitudeImportance(p=1)`` on them, the group's mean),
so that both rank by the same factors where they have them; exact for it means the same as
for slimming (its outputs equal the original's with the channels it cut zeroed in the norms).
"""

from __future__ import annotations

import copy
import gc
import json
import os
import signal
import statistics
import time
import warnings
from pathlib import Path

import torch
from common import guarded, parser, positive_int, sparsity_shaped
from torch import nn

import slimming
from slimming.layers.rules import ChannelGate, is_factor_layer
from slimming.pruning.norms import kept_statistics
from slimming.pruning.ops import leaves
from slimming.pruning.verify import check

PERCENT = 0.3
LIMIT = 60  # seconds Torch-Pruning may take on one network before it counts as not finishing

TORCHVISION = ["resnet18", "resnet34", "resnet50", "resnet101", "resnext50_32x4d", "wide_resnet50_2",
               "mobilenet_v2", "mobilenet_v3_large", "mobilenet_v3_small", "efficientnet_b0",
               "efficientnet_b3", "efficientnet_v2_s", "densenet121", "densenet169", "regnet_x_400mf",
               "regnet_y_400mf", "regnet_y_800mf", "mnasnet0_5", "mnasnet1_0", "vgg11_bn", "vgg16_bn",
               "googlenet", "inception_v3", "shufflenet_v2_x1_0", "squeezenet1_1", "convnext_tiny",
               "maxvit_t", "swin_t", "vit_b_16"]
TIMM = ["cspdarknet53", "cspresnet50", "cspresnext50", "darknet53", "res2net50_26w_4s", "ghostnet_100",
        "ghostnetv2_100", "repghostnet_050", "rexnet_100", "dla34", "dla46_c", "dpn68", "hrnet_w18_small",
        "mixnet_s", "ese_vovnet19b_dw", "repvgg_a0", "mobileone_s0", "selecsls42b", "convnext_atto",
        "resnet18", "resnet26t", "resnet50d", "resnetblur18", "seresnext26d_32x4d", "ecaresnet26t",
        "skresnet18", "resnest14d", "tresnet_m", "efficientnet_b0", "efficientnetv2_rw_t",
        "mobilenetv3_large_100", "tf_mobilenetv3_small_100", "mobilenetv4_conv_small", "mnasnet_100",
        "fbnetc_100", "hardcorenas_a", "lcnet_050", "tinynet_a", "regnetx_002", "regnety_002",
        "gernet_s", "hgnetv2_b0", "densenet121", "vgg11_bn", "inception_v3", "xception41",
        "nf_resnet26", "levit_128s", "mobilevit_xxs", "efficientvit_b0", "fastvit_t8", "repvit_m0_9",
        "edgenext_xx_small"]
SEGMENTATION = ["lraspp_mobilenet_v3_large", "deeplabv3_mobilenet_v3_large", "deeplabv3_resnet50",
                "fcn_resnet50"]
DETECTION = {"fasterrcnn_mobilenet_v3_large_320_fpn": {}, "ssdlite320_mobilenet_v3_large": {},
             "retinanet_resnet50_fpn": {"min_size": 224, "max_size": 224},
             "fcos_resnet50_fpn": {"min_size": 224, "max_size": 224}}
VIDEO = ["r3d_18", "mc3_18", "r2plus1d_18"]  # s3d needs 16 frames at 224x224: too slow here
TRANSFORMERS = ["vit_tiny_patch16_224", "deit_tiny_patch16_224", "deit3_small_patch16_224",
                "vit_relpos_small_patch16_224", "cait_xxs24_224", "convit_tiny",
                "swin_tiny_patch4_window7_224", "swinv2_cr_tiny_224", "coat_lite_tiny", "twins_pcpvt_small",
                "twins_svt_small", "pvt_v2_b0",
                "poolformer_s12", "caformer_s18", "efficientformer_l1", "efficientformerv2_s0",
                "xcit_nano_12_p16_224", "crossvit_tiny_240", "pit_ti_224", "resmlp_12_224", "gmlp_ti16_224",
                "mixer_s16_224", "nest_tiny", "visformer_tiny", "tnt_s_patch16_224", "tiny_vit_5m_224",
                "davit_tiny", "gcvit_xxtiny", "mvitv2_tiny", "focalnet_tiny_srf", "hiera_tiny_224",
                "eva02_tiny_patch14_224", "sebotnet33ts_256", "mobilevitv2_050", "nf_regnet_b0",
                "resnetv2_50x1_bit", "inception_next_tiny", "starnet_s1"]
TRANSFORMERS_TV = ["swin_v2_t", "alexnet"]
MIT = ["Segformer", "UPerNet", "FPN"]  # segmentation-models-pytorch on mit_b0
SMP = [("Unet", "resnet34"), ("UnetPlusPlus", "resnet18"), ("FPN", "efficientnet-b0"),
       ("DeepLabV3Plus", "resnet34"), ("PSPNet", "resnet34"), ("Linknet", "resnet18"),
       ("MAnet", "resnet18"), ("PAN", "resnet34")]


def networks(size: int) -> list[tuple]:
    """(name, builder, input shape (without the batch), kept: () or (slimming's ignore=,
    Torch-Pruning's ignored_layers), discrete: outputs after non-maximum suppression)."""
    import timm
    import torchvision
    from detector import SIZE, TinyYOLO

    image = (3, size, size)
    out = [(f"torchvision {n}", lambda n=n: torchvision.models.get_model(
        n, weights=None, num_classes=10, **({"init_weights": True} if n in ("googlenet", "inception_v3")
                                           else {})), (3, 299, 299) if n == "inception_v3" else image, (),
        False) for n in TORCHVISION]
    out += [(f"timm {n}", lambda n=n: timm.create_model(n, pretrained=False, num_classes=10),
             (3, 256, 256) if "maxvit" in n else image, (), False) for n in TIMM]
    # slimming keeps a model's outputs by itself; Torch-Pruning is told the layers that make them
    heads = {"lraspp_mobilenet_v3_large": ("classifier.low_classifier", "classifier.high_classifier")}
    out += [(f"torchvision {n}", lambda n=n: getattr(torchvision.models.segmentation, n)(
        weights=None, weights_backbone=None, num_classes=5, **({"aux_loss": False} if "resnet" in n else {})),
        image, ((), heads.get(n, ("classifier.4",))), False) for n in SEGMENTATION]
    out += [(f"torchvision {n}", lambda n=n, kw=kw: torchvision.models.get_model(
        n, weights=None, weights_backbone=None, num_classes=5, **kw), image, (), True)
        for n, kw in DETECTION.items()]
    out += [(f"torchvision {n}", lambda n=n: torchvision.models.get_model(n, weights=None, num_classes=10),
             (3, 8, 112, 112), (), False) for n in VIDEO]
    try:
        import segmentation_models_pytorch as smp
        out += [(f"smp {arch}({encoder})", lambda a=arch, e=encoder: getattr(smp, a)(
            e, encoder_weights=None, classes=3), image, ((), ("segmentation_head",)), False)
            for arch, encoder in SMP]
    except ImportError:
        pass
    out += [("own YOLO-style detector (benchmarks/detector.py)", TinyYOLO, (3, SIZE, SIZE),
             (("head",), ("head",)), False),
            ("own YOLO-style detector with C2PSA attention", lambda: TinyYOLO(attention=True),
             (3, SIZE, SIZE), (("head",), ("head",)), False),
            ("slimming vgg19 (traced)", lambda: slimming.models.build("vgg", depth=19), (3, 32, 32), (),
             False)]
    return out


def transformers() -> list[tuple]:
    """The ``--section transformers`` networks, as ``networks`` gives them (none of them in it)."""
    import timm
    import torchvision

    out = []
    for n in TRANSFORMERS:
        cfg = timm.models.get_pretrained_cfg(n)
        shape = tuple(cfg.input_size) if cfg else (3, 224, 224)
        build = lambda n=n: timm.create_model(n, pretrained=False, num_classes=10)  # noqa: E731
        out.append((f"timm {n}", build, shape, (), False))
    out += [(f"torchvision {n}", lambda n=n: torchvision.models.get_model(n, weights=None, num_classes=10),
             (3, 224, 224), (), False) for n in TRANSFORMERS_TV]
    try:
        import segmentation_models_pytorch as smp
        out += [(f"smp {a}(mit_b0)", lambda a=a: getattr(smp, a)("mit_b0", encoder_weights=None, classes=3),
                 (3, 224, 224), ((), ("segmentation_head",)), False) for a in MIT if hasattr(smp, a)]
    except ImportError:
        pass
    return out


def new_section() -> list[tuple]:
    """The ``--section new`` networks (issue 47): diffusers' AutoencoderKL and MONAI's 3-D UNet,
    BasicUNet and SegResNet, one input each, by the transformers section's routes (gates where no
    norm scores a width; Torch-Pruning ranking every norm's |gamma|)."""
    import diffusers
    from monai.networks import nets

    def vae():
        return diffusers.AutoencoderKL(
            in_channels=3, out_channels=3, block_out_channels=(32, 64), layers_per_block=1, latent_channels=4,
            norm_num_groups=8, down_block_types=("DownEncoderBlock2D",) * 2,
            up_block_types=("UpDecoderBlock2D",) * 2)

    volume = (1, 32, 32, 32)
    unet = lambda: nets.UNet(spatial_dims=3, in_channels=1, out_channels=2,  # noqa: E731
                             channels=(16, 32, 64, 128), strides=(2, 2, 2))
    return [("diffusers AutoencoderKL", vae, (3, 64, 64), (), False),
            ("MONAI UNet", unet, volume, (), False),
            ("MONAI BasicUNet", lambda: nets.BasicUNet(spatial_dims=3, in_channels=1, out_channels=2),
             volume, (), False),
            ("MONAI SegResNet", lambda: nets.SegResNet(spatial_dims=3, in_channels=1, out_channels=2),
             volume, (), False)]


def with_statistics(model: nn.Module, seed: int = 1) -> None:
    """Random betas (and running statistics) in every BatchNorm, GroupNorm and LayerNorm, so
    that a cut channel's constant output (what exactness is about) is not zero."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.modules.batchnorm._BatchNorm, nn.GroupNorm, nn.LayerNorm)) \
                    and getattr(m, "bias", None) is not None:
                n = m.bias.numel()
                m.bias.copy_(torch.randn(n, generator=g) * 0.3)
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.running_mean is not None:
                m.running_mean.copy_(torch.randn(n, generator=g) * 0.2)
                m.running_var.copy_(torch.rand(n, generator=g) + 0.5)


def output_of(y) -> torch.Tensor:
    if isinstance(y, dict) and "out" in y:
        y = y["out"]
    return torch.cat([t.flatten().float() for t in leaves(y) if t.is_floating_point()])


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()


def zeroed(model: nn.Module, masks: dict[str, torch.Tensor]):
    """The original with the cut channels' gamma and beta zeroed, each LayerNorm that lost
    channels normalising over its kept ones (what a LayerNorm's cut promises); a layer whose
    rows go with the channels they meet (a timestep's projection, ``result.masks``) loses them."""
    z = copy.deepcopy(model)
    with torch.no_grad():
        for name, keep in masks.items():
            bn = z.get_submodule(name)
            for t in (bn.weight, getattr(bn, "bias", None)):  # a gate has no bias
                if t is not None:  # a gate's weight may be laid out (1, C, 1, 1); a layer's rows are dim 0
                    (t if t.shape[0] == keep.numel() else t.view(-1))[~keep] = 0

    def run(*args):
        with kept_statistics(z, masks):
            return z(*args)
    return run


def masks_by_value(original: nn.Module, pruned: nn.Module) -> dict[str, torch.Tensor]:
    """Which channels each norm (BatchNorm, LayerNorm, GroupNorm) kept, found by its surviving
    gammas (all distinct)."""
    masks = {}
    pruned_modules = dict(pruned.named_modules())
    for name, bn in original.named_modules():
        if isinstance(bn, NORMS) and getattr(bn, "weight", None) is not None and name in pruned_modules:
            kept = pruned_modules[name].weight.detach()
            masks[name] = torch.isin(bn.weight.detach(), kept)
    return masks


NORMS = (nn.modules.batchnorm._BatchNorm, nn.LayerNorm, nn.GroupNorm)


def gated(model: nn.Module, example: torch.Tensor, seed: int = 2) -> None:
    """slimming's route for transformers and networks without normalisation: ``add_gates``
    (everywhere, where no norm scores any channel), the gates' values sparsity-shaped as
    ``sparsity_shaped`` shapes the gammas (their own generator: the norms stay as they were)."""
    everywhere = not any(is_factor_layer(m) and getattr(m, "weight", None) is not None
                         for m in model.modules())  # a norm without affine scores nothing
    slimming.add_gates(model, example, everywhere=everywhere)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, ChannelGate):
                n = m.weight.numel()
                w = (torch.rand(n, generator=g) * 0.9 + 0.1) * torch.sign(torch.randn(n, generator=g))
                w[torch.rand(n, generator=g) < 0.5] *= 1e-3
                m.weight.copy_(w.view_as(m.weight))


def their_vit_route(m: nn.Module, example: torch.Tensor, ignored: list, tp) -> None:
    """Torch-Pruning's ViT example's settings, ranking by every norm's |gamma|, in place."""
    heads = {mod.qkv: mod.num_heads for mod in m.modules() if isinstance(getattr(mod, "qkv", None), nn.Linear)
             and isinstance(getattr(mod, "num_heads", None), int)}
    importance = tp.importance.GroupMagnitudeImportance(p=1, group_reduction="mean", normalizer=None,
                                                         bias=False, target_types=NORMS)
    pruner = tp.pruner.MetaPruner(m, example, importance=importance, global_pruning=True,
                                  pruning_ratio=PERCENT, ignored_layers=ignored, num_heads=heads,
                                  prune_head_dims=True, prune_num_heads=False)
    pruner.step()
    for mod in m.modules():  # as its example sets them after the step
        qkv = getattr(mod, "qkv", None)
        if qkv in pruner.num_heads and hasattr(mod, "head_dim"):
            mod.num_heads = pruner.num_heads[qkv]
            mod.head_dim = qkv.out_features // (3 * mod.num_heads)


def params(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def timed(fns, repeats: int) -> list[float]:
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            try:
                fn()
            except Exception:  # a tool that fails has no time
                times[i].append(float("nan"))
                continue
            times[i].append(time.perf_counter() - start)
            gc.collect()  # each tool's garbage is collected outside the other's timing
    return [statistics.median(t) for t in times]


def one(name: str, build, shape: tuple, keep: tuple, discrete: bool, repeats: int, tp,
        transformer: bool = False) -> dict:
    torch.manual_seed(0)
    model = build().eval()
    sparsity_shaped(model, seed=0)
    with_statistics(model)
    example = torch.zeros(1, *shape)
    plain, refused = model, None  # plain: what Torch-Pruning is given
    if transformer:
        plain, model = model, copy.deepcopy(model)
        try:
            gated(model, example)
        except slimming.SlimmingError as e:
            refused = e
    x = torch.randn(2, *shape, generator=torch.Generator().manual_seed(1))
    row = {"network": name, "size": "x".join(map(str, shape[1:])), "params": params(plain)}

    ours_keep, tp_keep = keep or ((), ())

    def ours(verify=False):
        return slimming.prune(model, percent=PERCENT, importance="bn-mean", example_inputs=example,
                              compensate=False, ignore=ours_keep, verify=verify)

    def theirs():
        m = copy.deepcopy(plain)
        linears = [x for x in m.modules() if isinstance(x, nn.Linear)]
        ignored = [m.get_submodule(k) for k in tp_keep] or linears[-1:]
        if transformer:
            their_vit_route(m, example, ignored, tp)
            return m
        pruner = tp.pruner.BNScalePruner(
            m, example, importance=tp.importance.BNScaleImportance(group_reduction="mean", normalizer=None),
            global_pruning=True, pruning_ratio=PERCENT, ignored_layers=ignored)
        pruner.step()
        return m

    try:
        if refused is not None:
            raise refused
        result = ours(verify=True)
        row.update(ours_cut=1 - params(result.model) / row["params"], ours_verified=result.verified)
        if discrete:  # after non-maximum suppression: the check's module-by-module comparison
            row.update(ours_exact=result.verified < 1e-4, ours_diff=result.verified)
        else:
            with torch.no_grad():
                diff = rel_diff(output_of(result.model(x)), output_of(zeroed(model, result.masks)(x)))
            row.update(ours_exact=diff < 1e-4, ours_diff=diff)
    except slimming.SlimmingError as e:
        row.update(ours_error=str(e)[:200])

    def alarm(signum, frame):
        raise TimeoutError(f"did not finish in {LIMIT} s")

    try:
        signal.signal(signal.SIGALRM, alarm)
        signal.alarm(LIMIT)  # Torch-Pruning never returns on some networks (rexnet_100)
        try:
            small = theirs()
        finally:
            signal.alarm(0)
        row["tp_cut"] = 1 - params(small) / params(plain)
        try:
            with torch.no_grad():
                out = output_of(small(x))
                diff = rel_diff(out, output_of(zeroed(plain, masks_by_value(plain, small))(x)))
            row.update(tp_runs=True, tp_exact=diff < 1e-4 and not discrete, tp_diff=diff)
        except Exception as e:
            row.update(tp_runs=False, tp_error=f"{type(e).__name__}: {str(e)[:120]}")
    except Exception as e:
        row.update(tp_error=f"{type(e).__name__} while pruning: {str(e)[:120]}")
    if "ours_error" not in row:
        fns = [lambda: ours().model, lambda: ours(verify=True).model] + ([theirs] if "tp_cut" in row else [])
        t = timed(fns, repeats)
        row["ours_ms"], row["checked_ms"] = 1000 * t[0], 1000 * t[1]
        if len(t) > 2:
            row["tp_ms"] = 1000 * t[2]
        pruned = ours()  # the check against forwards of the original, interleaved
        with torch.no_grad():
            check_s, forward_s = timed([lambda: check(model, pruned, example), lambda: model(example)],
                                       repeats)
        row["check_forwards"] = check_s / forward_s
    return row


def cell(row: dict, who: str) -> str:
    if f"{who}_cut" not in row:
        why = row.get(f"{who}_error", "?")
        if who == "ours" and why.startswith("not built"):
            return why
        if who == "ours":  # slimming's refusals are one line: say what it named
            if "no BatchNorm" in why:
                return "refused: no BatchNorm"
            for known in ("can be cut", "refused its own cut"):
                if known in why:
                    return "refused: " + why.split(": ", 1)[-1][:90]
        return ("did not finish in 60 s" if "did not finish" in why else "error: " + why.split(":")[0])
    ran = row.get(f"{who}_runs", True)
    exact = "exact" if row.get(f"{who}_exact") else ("does not run" if not ran else
                                                        f"not exact ({row[f'{who}_diff']:.1e})")
    return f"{row[f'{who}_cut']:.1%}, {exact}"


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--size", type=positive_int, default=224)
    ap.add_argument("--repeats", type=positive_int, default=3)
    ap.add_argument("--only", default="", help="comma-separated parts of network names")
    ap.add_argument("--out", type=Path, default=Path("runs/network_table.json"))
    ap.add_argument("--section", choices=("classic", "transformers", "new"), default="classic",
                    help="transformers: the section of transformers, hybrids and networks without "
                         "normalisation, each tool by its documented route for them; new: diffusers' "
                         "AutoencoderKL and MONAI's 3-D networks, by the same routes")
    args = ap.parse_args()
    try:
        import torch_pruning as tp  # the peer measured here; not a dependency of slimming
    except ImportError:
        ap.error("this comparison needs Torch-Pruning: pip install torch-pruning")
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(2)  # the figures in RESULTS.md: 2 threads
    warnings.simplefilter("ignore")
    rows = []
    print("| network | parameters | slimming: cut, result | Torch-Pruning: cut, result | "
          "slimming ms | checked ms | Torch-Pruning ms | ratio | checked ratio | check (forwards) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    sections = {"transformers": transformers, "new": new_section}
    section = sections.get(args.section, lambda: networks(args.size))()
    for name, build, shape, keep, discrete in section:
        if args.only and not any(part in name for part in args.only.split(",")):
            continue
        try:
            row = one(name, build, shape, keep, discrete, args.repeats, tp, args.section != "classic")
        except Exception as e:  # a network this torch/timm cannot build or run: say so, go on
            row = {"network": name, "size": "x".join(map(str, shape[1:])), "params": 0,
                   "ours_error": f"not built: {type(e).__name__}: {str(e)[:100]}",
                   "tp_error": "not built"}
        rows.append(row)
        ratio, checked = (f"{row[k] / row['tp_ms']:.2f}" if "tp_ms" in row and k in row else "-"
                          for k in ("ours_ms", "checked_ms"))
        forwards = f"{row['check_forwards']:.1f}" if "check_forwards" in row else "-"
        print(f"| {name} @{row['size']} | {row['params'] / 1e6:.2f}M | {cell(row, 'ours')} | "
              f"{cell(row, 'tp')} | {row.get('ours_ms', float('nan')):.0f} | "
              f"{row.get('checked_ms', float('nan')):.0f} | {row.get('tp_ms', float('nan')):.0f} | "
              f"{ratio} | {checked} | {forwards} |", flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=2))  # as it goes: a long run keeps what it did
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=2))
    both = [r for r in rows if "tp_ms" in r and "ours_ms" in r]
    if both:
        median = {k: statistics.median(r[k] / r["tp_ms"] for r in both) for k in ("ours_ms", "checked_ms")}
        forwards = statistics.median(r["check_forwards"] for r in rows if "check_forwards" in r)
        print(f"\nmedian over the {len(both)} networks both tools prune: slimming over Torch-Pruning "
              f"{median['ours_ms']:.2f}x unchecked, {median['checked_ms']:.2f}x checked (the default); "
              f"the check {forwards:.2f} forwards of the original")


if __name__ == "__main__":
    raise SystemExit(guarded(main))
