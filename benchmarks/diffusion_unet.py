"""A diffusion UNet slimmed end to end (issue 47, item 5): diffusers' ``UNet2DModel`` (small: two
levels, 32 and 64 channels, GroupNorm), trained with the DDPM loss (predict the noise added at a
random timestep of a linear 1000-step schedule) on the CIFAR-10 copy, with the L1 term on its
GroupNorm gammas (``slimming.Sparsity``); pruned as it is called (``unet(x, t)``: 30% of the
channels, or ``--percent``), then fine-tuned without the L1 term. Prints, per seed, the DDPM
loss on a fixed held-out set of test images, noises and timesteps: trained, right after the
cut, fine-tuned, and the unpruned network trained as many steps more (the control: the
fine-tuning's gain is partly more training), with the parameters and FLOPs kept; then the mean
and spread over the seeds.
Needs diffusers (in ``[dev]``); one CPU thread per process unless OMP_NUM_THREADS says otherwise.

    python benchmarks/diffusion_unet.py --data-root ../shared/data/cifar10-jpeg \\
        [--steps 300] [--finetune-steps 100] [--sparsity 1e-3] [--seeds 0,1,2]
"""

from __future__ import annotations

import statistics
import time
import warnings
from pathlib import Path

import torch
from common import guarded, parser, positive_int

import slimming
from slimming.measure.stats import count_flops

T = 1000  # the DDPM schedule's steps


def unet():
    import diffusers
    return diffusers.UNet2DModel(
        sample_size=32, in_channels=3, out_channels=3, layers_per_block=1, block_out_channels=(32, 64),
        norm_num_groups=8, down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"))


def images(root: Path, split: str, count: int, seed: int) -> torch.Tensor:
    """``count`` images of the split, chosen at random (``seed``), in [-1, 1]."""
    from torchvision import datasets, transforms
    data = datasets.ImageFolder(str(root / split), transforms.ToTensor())
    picked = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed))[:count]
    return torch.stack([data[int(i)][0] for i in picked]) * 2 - 1


def noised(x0: torch.Tensor, gen: torch.Generator):
    """(x_t, t, noise) of the DDPM forward process at random timesteps."""
    betas = torch.linspace(1e-4, 0.02, T)
    alpha_bar = torch.cumprod(1 - betas, 0)
    t = torch.randint(0, T, (len(x0),), generator=gen)
    noise = torch.randn(x0.shape, generator=gen)
    a = alpha_bar[t].view(-1, 1, 1, 1)
    return a.sqrt() * x0 + (1 - a).sqrt() * noise, t, noise


def loss_of(model, batch) -> torch.Tensor:
    x_t, t, noise = batch
    return torch.nn.functional.mse_loss(model(x_t, t).sample, noise)


def train(model, data: torch.Tensor, steps: int, batch: int, seed: int, sparsity=None) -> None:
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-4, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(steps):
        x0 = data[torch.randint(0, len(data), (batch,), generator=gen)]
        optimizer.zero_grad()
        loss_of(model, noised(x0, gen)).backward()
        if sparsity is not None:
            sparsity.apply()
        optimizer.step()
    model.eval()


@torch.no_grad()
def held_out(model, batches) -> float:
    model.eval()
    return statistics.mean(loss_of(model, b).item() for b in batches)


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--data-root", type=Path, required=True)
    p.add_argument("--steps", type=positive_int, default=300)
    p.add_argument("--finetune-steps", type=positive_int, default=100)
    p.add_argument("--batch-size", type=positive_int, default=32)
    p.add_argument("--sparsity", type=float, default=1e-3)
    p.add_argument("--percent", type=float, default=0.3)
    p.add_argument("--seeds", default="0,1,2")
    args = p.parse_args()
    if not (args.data_root / "train").is_dir():
        p.error(f"--data-root {args.data_root} has no train/ folder (ImageFolder layout)")
    warnings.simplefilter("ignore")
    train_images = images(args.data_root, "train", 4096, 0)
    gen = torch.Generator().manual_seed(123)
    test = images(args.data_root, "test", 256, 1)
    batches = [noised(test[i:i + 64], gen) for i in range(0, len(test), 64)]
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        torch.manual_seed(seed)
        model = unet()
        start = time.perf_counter()
        train(model, train_images, args.steps, args.batch_size, seed, slimming.Sparsity(model, args.sparsity))
        trained = held_out(model, batches)
        example = (torch.zeros(1, 3, 32, 32), torch.tensor([10]))
        result = slimming.prune(model, percent=args.percent, example_inputs=example)
        cut = held_out(result.model, batches)
        train(result.model, train_images, args.finetune_steps, args.batch_size, seed + 100)
        tuned = held_out(result.model, batches)
        train(model, train_images, args.finetune_steps, args.batch_size, seed + 100)  # the control:
        longer = held_out(model, batches)  # the unpruned network, trained the same steps more
        kept = sum(t.numel() for t in result.model.parameters())
        params = kept / sum(t.numel() for t in model.parameters())
        flops = count_flops(result.model, inputs=example) / count_flops(model, inputs=example)
        rows.append((trained, cut, tuned, longer, params, flops))
        print(f"seed {seed}: held-out DDPM loss trained {trained:.4f}, cut {cut:.4f}, "
              f"fine-tuned {tuned:.4f}, unpruned trained as long {longer:.4f}; "
              f"{100 * params:.1f}% of the parameters and {100 * flops:.1f}% of the FLOPs kept; "
              f"{time.perf_counter() - start:.0f} s", flush=True)
    for i, what in enumerate(("trained", "cut", "fine-tuned", "unpruned trained as long", "parameters kept",
                              "FLOPs kept")):
        values = [r[i] for r in rows]
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        print(f"{what}: {statistics.mean(values):.4f} +- {spread:.4f} ({min(values):.4f}-{max(values):.4f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(guarded(main))
