"""Which estimator of a latency ratio two runs agree on (issue 43): a network and a cut of it
are timed in ``--runs`` separate runs of ``--rounds`` interleaved rounds each (2 s apart), quiet
or beside ``--load`` CPU-bound Python loops, and each estimator's value is compared across the
runs (their standard deviation: what two runs of one prune disagree by) with its own bootstrap
spread in each run (a 95% half-width over resampled rounds: what it would print).

Estimators: the median of the rounds' ratios (``timing.ratio``, what slimming uses), the ratio
of the networks' 10% quantiles, 25% quantiles, minima and medians, and the 25% quantile of the
rounds' ratios.

    python benchmarks/latency_estimators.py --net resnet50 --threads 1 2 --load 0 2
"""

from __future__ import annotations

import random
import statistics
import sys
import time
import warnings

import torch
from common import guarded, parser, positive_int, sparsity_shaped
from latency_robust import build, ignore_of, load

import slimming
from slimming.measure.latency import time_interleaved
from slimming.measure.timing import low_quantile

ESTIMATORS = {
    "median of the rounds' ratios": lambda o, p: statistics.median([b / a for a, b in zip(o, p)]),
    "ratio of 10% quantiles": lambda o, p: low_quantile(p, 0.1) / low_quantile(o, 0.1),
    "ratio of 25% quantiles": lambda o, p: low_quantile(p, 0.25) / low_quantile(o, 0.25),
    "ratio of minima": lambda o, p: min(p) / min(o),
    "ratio of medians": lambda o, p: statistics.median(p) / statistics.median(o),
    "25% quantile of the ratios": lambda o, p: low_quantile([b / a for a, b in zip(o, p)], 0.25),
}


def boot(o: list[float], p: list[float], f, resamples: int = 200) -> float:
    rng, n, out = random.Random(0), len(o), []
    for _ in range(resamples):
        idx = [rng.randrange(n) for _ in range(n)]
        out.append(f([o[i] for i in idx], [p[i] for i in idx]))
    out.sort()
    return (out[int(0.975 * (resamples - 1))] - out[int(0.025 * (resamples - 1))]) / 2


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--net", default="resnet50")
    p.add_argument("--threads", nargs="+", type=positive_int, default=[1, 2])
    p.add_argument("--load", nargs="+", type=int, default=[0, 2])
    p.add_argument("--runs", type=positive_int, default=5)
    p.add_argument("--rounds", type=positive_int, default=24)
    p.add_argument("--percent", type=float, default=0.3, help="the cut compared with the original")
    args = p.parse_args()
    model = build(args.net)
    sparsity_shaped(model, small=0.5, seed=0)
    x = torch.randn(1, 3, 224, 224)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cut = slimming.prune(model, percent=args.percent, example_inputs=x, ignore=ignore_of(args.net))
    cut = cut.model.eval()
    for threads in args.threads:
        torch.set_num_threads(threads)
        for n in args.load:
            with load(n):
                runs = []
                for _ in range(args.runs):
                    runs.append(time_interleaved([model, cut], (x,), args.rounds))
                    time.sleep(2)
            per_run = [round(low_quantile(o, 0.1)) for o, _ in runs]
            print(f"{args.net}, {threads} thread(s), {n} busy loop(s): {args.runs} runs of {args.rounds} "
                  f"rounds; the original's 10% quantile per run: {per_run} ms")
            for name, f in ESTIMATORS.items():
                values = [f(o, q) for o, q in runs]
                spreads = [boot(o, q, f) for o, q in runs]
                print(f"  {name:<28} sd across runs {statistics.stdev(values):.3f} (range {min(values):.3f}-"
                      f"{max(values):.3f}); its spread in a run {statistics.median(spreads):.3f} (median)",
                      flush=True)


if __name__ == "__main__":
    sys.exit(guarded(main))
