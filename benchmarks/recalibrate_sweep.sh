#!/usr/bin/env bash
# Issue 35: does sweep's default BatchNorm re-estimation (--recalibrate-bn 50) help or cost
# accuracy right after the cut? A quarter-width VGG-11 sparsity-trained 4 epochs on the
# CIFAR-10 JPEG copy (seeds 0, 1, 2), then `slimming sweep` at 10%..70% with 50 batches of
# re-estimation and with none, on the 10,000 test images (CPU, about 10 minutes a seed).
#   bash benchmarks/recalibrate_sweep.sh [DATA_ROOT] [OUT_DIR] [SEEDS]
set -euo pipefail
D=${1:-../shared/data/cifar10-jpeg}
OUT=${2:-runs/recalibrate}
SEEDS=${3:-"0 1 2"}
CFG=16,M,32,M,64,64,M,128,128,M,128,128
DATA=(--dataset imagefolder --data-root "$D" --workers 2)
for s in $SEEDS; do
    slimming train --arch vgg --cfg $CFG "${DATA[@]}" --epochs 4 --sparsity 3e-3 --seed "$s" \
        --save "$OUT/sparse-$s" --overwrite
    for n in 50 0; do
        slimming sweep --checkpoint "$OUT/sparse-$s/last.pth" --percents 0.1:0.7:0.1 "${DATA[@]}" \
            --recalibrate-bn "$n" --save "$OUT/sweep-$s-bn$n"
    done
done
python - "$OUT" $SEEDS <<'PY'
import json, statistics, sys
out, seeds = sys.argv[1], sys.argv[2:]
rows = {}
for s in seeds:
    for n in (50, 0):
        for r in json.load(open(f"{out}/sweep-{s}-bn{n}/sweep.json")):
            if not r.get("reference"):
                rows.setdefault(r["percent"], {}).setdefault(n, []).append(r["acc"])
print("| percent | --recalibrate-bn 50 | --recalibrate-bn 0 | difference (50 - 0) |")
print("|---|---|---|---|")
for p, by in sorted(rows.items()):
    d = [a - b for a, b in zip(by[50], by[0])]
    f = lambda v: f"{statistics.mean(v):.2f}% ({min(v):.2f}-{max(v):.2f})"
    print(f"| {p:.1f} | {f(by[50])} | {f(by[0])} | {statistics.mean(d):+.2f} ({min(d):+.2f} to {max(d):+.2f}) |")
PY
