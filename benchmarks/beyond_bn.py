"""Networks without BatchNorm, on real data: a ConvNeXt-atto and a ViT-tiny (timm's, random
weights, 32x32 inputs) on the CIFAR-10 JPEG copy, on the CPU, against Torch-Pruning.

For each network: a baseline (no sparsity); a sparsity run (``--gates --sparsity 1e-3``: the
LayerNorm gammas and the gates before each MLP's second layer trained toward zero); that run
pruned to half the FLOPs (``--target-flops 0.5``) and fine-tuned. The peer prunes the baseline
to the same FLOPs as slimming's cut reached, with the settings of its own timm-ViT example
(``GroupMagnitudeImportance(p=1)`` and ``GroupTaylorImportance``, a uniform ratio, the head kept,
head dims cut, the attention's reshape patched as that example patches it), found by bisection
on its ratio; then the same fine-tune. Every row: test accuracy, parameters, FLOPs, CPU latency
at batch 1 and 64. The subsets (``--per-class`` training and ``--test-per-class`` test images
of each class; the ViT at patch size 8, 16 tokens) keep the CPU run to under an hour.

    python benchmarks/beyond_bn.py [--data-root ../shared/data/cifar10-jpeg] [--out runs/beyond]
        [--nets convnext_atto,vit_tiny] [--epochs 10] [--ft-epochs 3] [--per-class 500]
        [--test-per-class 300]
"""

from __future__ import annotations

import copy
import json
import shutil
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from common import accuracy, guarded, loaders_like, out_folder, parser, positive_int, run

import slimming
from slimming.measure.stats import count_flops, model_stats
from slimming.training.config import TrainConfig
from slimming.training.train import train

NETS = {"convnext_atto": ["--arch", "timm:convnext_atto"],
        "vit_tiny": ["--arch", "timm:vit_tiny_patch16_224", "--model-kwargs", '{"patch_size": 8}']}
# SGD, as the paper trains: AdamW divides the L1 term by the gradient's running size, so a gamma
# moves by at most about lr a step whatever the strength (a first run with AdamW left every
# gamma above 1e-2 after 400 steps at strength 10)
OPT = ["--opt", "sgd", "--lr", "0.05", "--weight-decay", "5e-4", "--sched", "cosine", "--warmup-epochs", "1",
       "--batch-size", "128", "--seed", "0", "--cpu"]
FT = ["--opt", "sgd", "--lr", "0.01", "--weight-decay", "5e-4", "--sched", "cosine", "--batch-size", "128",
      "--seed", "0", "--cpu"]


def subset(root: Path, out: Path, per_class: int, test_per_class: int) -> Path:
    """The first ``per_class`` training and ``test_per_class`` test images of each class, copied."""
    if (out / "done").exists():
        return out
    for split, count in (("train", per_class), ("test", test_per_class)):
        for folder in sorted((root / split).iterdir()):
            dest = out / split / folder.name
            dest.mkdir(parents=True, exist_ok=True)
            for f in sorted(folder.iterdir())[:count]:
                shutil.copyfile(f, dest / f.name)
    (out / "done").write_text("")
    return out


def describe(model, acc: float) -> dict:
    s = model_stats(model.eval(), tuple(model.input_size), repeats=20)
    return {"acc": round(acc, 2), "params": s["params"], "flops": s["flops"],
            "latency_b1_ms": s["latency_ms"][1], "latency_b64_ms": s["latency_ms"][64]}


def _attention_forward(self, x, attn_mask=None, **unused):
    """timm's Attention, reshaped to the width its heads give (as the peer's ViT example
    patches it: the original reshapes to the input's width)."""
    b, n, _ = x.shape
    qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    q, k = self.q_norm(q), self.k_norm(k)
    x = F.scaled_dot_product_attention(q, k, v)
    return self.proj_drop(self.proj(self.norm(x.transpose(1, 2).reshape(b, n, -1))))


def peer(model, kind: str, ratio: float, batches) -> torch.nn.Module:
    """Torch-Pruning's cut of a copy of ``model`` at channel ratio ``ratio``."""
    import timm
    import torch_pruning as tp

    model = copy.deepcopy(model).eval()
    example = torch.zeros(1, *model.input_size)
    heads = {}
    for m in model.modules():
        if isinstance(m, timm.models.vision_transformer.Attention):
            m.forward = _attention_forward.__get__(m)
            heads[m.qkv] = m.num_heads
    head = model.get_classifier()
    imp = tp.importance.GroupMagnitudeImportance(p=1) if kind == "l1" \
        else tp.importance.GroupTaylorImportance()
    pruner = tp.pruner.BasePruner(model, example, global_pruning=False, importance=imp,
                                  pruning_ratio=ratio, ignored_layers=[head], num_heads=heads,
                                  prune_num_heads=False, prune_head_dims=True, round_to=1)
    if kind == "taylor":
        model.zero_grad()
        for i, (x, y) in enumerate(batches):
            if i >= 10:
                break
            F.cross_entropy(model(x), y).backward()
    pruner.step()
    for m in model.modules():
        if isinstance(m, timm.models.vision_transformer.Attention):
            m.num_heads = pruner.num_heads[m.qkv]
            m.head_dim = m.qkv.out_features // (3 * m.num_heads)
    return model.zero_grad() or model


def peer_at(model, kind: str, flops: float, batches) -> tuple[torch.nn.Module, float]:
    """The peer's cut whose FLOPs come closest to ``flops`` from above or at it (bisection)."""
    lo, hi, best = 0.0, 0.95, None
    for _ in range(12):
        mid = (lo + hi) / 2
        cut = peer(model, kind, mid, batches)
        got = count_flops(cut.eval(), tuple(model.input_size))
        if got <= flops:
            best, hi = (cut, mid), mid
        else:
            lo = mid
    return best


def gate_stats(model, loader) -> dict:
    """The gates and what they feed: the fraction of gates under 1e-2, their mean |value|, the
    mean L2 norm of the input columns of the layers they feed (which can grow while a gate
    shrinks: the paper's objection to a bare scaling factor), and the test accuracy right after
    a cut to half the FLOPs (no fine-tune)."""
    from slimming.layers.gates import ATTR

    gates, columns = [], []
    for m in model.modules():
        gate = getattr(m, ATTR, None)
        if gate is not None:
            gates.append(gate.weight.detach().abs().flatten())
            columns.append(m.weight.detach().transpose(0, 1).flatten(1).norm(dim=1))
    gates, columns = torch.cat(gates), torch.cat(columns)
    cut = slimming.prune(model, target_flops=0.5).model
    return {"gates_lt_1e-2": round((gates < 1e-2).float().mean().item(), 4),
            "mean_abs_gate": round(gates.mean().item(), 4),
            "mean_column_norm": round(columns.mean().item(), 4),
            "acc_after_half_flops_cut": round(accuracy(cut, loader), 2)}


def finetune(model, out: Path, data_root: Path, epochs: int) -> torch.nn.Module:
    config = TrainConfig(save=out, epochs=epochs, dataset="imagefolder", data_root=data_root,
                         batch_size=128, opt="sgd", lr=0.01, weight_decay=5e-4, sched="cosine",
                         seed=0, cpu=True, overwrite=True)
    train(config, model)
    return model


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--data-root", type=Path, default=Path("../shared/data/cifar10-jpeg"))
    ap.add_argument("--out", type=out_folder, default=Path("runs/beyond"))
    ap.add_argument("--nets", default="convnext_atto,vit_tiny")
    ap.add_argument("--epochs", type=positive_int, default=10)
    ap.add_argument("--ft-epochs", type=positive_int, default=3)
    ap.add_argument("--per-class", type=positive_int, default=500)
    ap.add_argument("--test-per-class", type=positive_int, default=300)
    ap.add_argument("--strength", type=float, default=1e-3, help="the sparsity run's --sparsity")
    args = ap.parse_args()
    root = subset(args.data_root, args.out / "data", args.per_class, args.test_per_class)
    data = ["--dataset", "imagefolder", "--data-root", root]
    saved = args.out / "results.json"
    results = json.loads(saved.read_text()) if saved.exists() else {}
    for net in args.nets.split(","):
        out, row = args.out / net, {}
        base = ["--epochs", args.epochs, *NETS[net], *data, *OPT]
        row["baseline_seconds"] = round(run("train", *base, "--save", out / "baseline", "--resume", "auto"))
        row["sparse_seconds"] = round(run("train", *base, "--gates", "--sparsity", args.strength,
                                          "--save", out / "sparse", "--resume", "auto"))
        ckpt = slimming.load_checkpoint(out / "baseline" / "last.pth")
        train_loader, test_loader = loaders_like(root, ckpt, 128)
        baseline = slimming.load_model(out / "baseline" / "last.pth")
        sparse = slimming.load_model(out / "sparse" / "last.pth")
        row["baseline"] = describe(baseline, accuracy(baseline, test_loader))
        row["sparse"] = describe(sparse, accuracy(sparse, test_loader))
        run("prune", "--checkpoint", out / "sparse" / "last.pth", "--target-flops", "0.5", "--save",
            out / "pruned", "--overwrite", "--cpu", "--no-eval")
        pruned = slimming.load_model(out / "pruned" / "pruned.pth")
        row["pruned"] = describe(pruned, accuracy(pruned, test_loader))
        row["heads"] = [[m.num_heads for m in net_.modules()  # before and after the cut, per attention
                         if isinstance(getattr(m, "num_heads", None), int)] for net_ in (sparse, pruned)]
        run("finetune", "--checkpoint", out / "pruned" / "pruned.pth", *data, "--epochs", args.ft_epochs, *FT,
            "--save", out / "finetuned", "--resume", "auto")
        ft = slimming.load_model(out / "finetuned" / "last.pth")
        row["finetuned"] = describe(ft, accuracy(ft, test_loader))
        flops = row["pruned"]["flops"]
        for kind in ("l1", "taylor"):
            cut, ratio = peer_at(baseline, kind, flops, train_loader)
            entry = {"ratio": round(ratio, 4), "pruned": describe(cut, accuracy(cut, test_loader))}
            tuned = finetune(cut, out / f"peer_{kind}", root, args.ft_epochs)
            entry["finetuned"] = describe(tuned, accuracy(tuned, test_loader))
            row[f"torch_pruning_{kind}"] = entry
        if net == "convnext_atto":  # the paper's objection: the same sparsity run without weight decay
            run("train", *base, "--gates", "--sparsity", args.strength, "--weight-decay", "0",
                "--save", out / "sparse_no_wd", "--resume", "auto")
            no_wd = slimming.load_model(out / "sparse_no_wd" / "last.pth")
            row["objection"] = {"weight_decay_5e-4": gate_stats(sparse, test_loader),
                                "weight_decay_0": gate_stats(no_wd, test_loader)}
        results[net] = row
        saved.write_text(json.dumps(results, indent=1))
        print(json.dumps({net: row}, indent=1), flush=True)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    sys.exit(guarded(main))
