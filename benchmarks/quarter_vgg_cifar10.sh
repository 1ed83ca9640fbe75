#!/usr/bin/env bash
# The spine's real-data run: a quarter-width VGG-11 sparsity-trained 8 epochs on the CIFAR-10
# JPEG copy, pruned at 50%, fine-tuned 3 epochs, evaluated at each stage (CPU, ~15-25 min).
#   bash benchmarks/quarter_vgg_cifar10.sh [DATA_ROOT] [OUT_DIR]
# --loader torchvision reproduces the run recorded in RESULTS.md (made before the fast loader);
# drop it to train about twice as fast.
set -euo pipefail
D=${1:-../shared/data/cifar10-jpeg}
OUT=${2:-runs/quarter-vgg}
CFG=16,M,32,M,64,64,M,128,128,M,128,128
COMMON=(--dataset imagefolder --data-root "$D" --workers 2 --loader torchvision)
slimming train --arch vgg --cfg $CFG "${COMMON[@]}" --epochs 8 --sparsity 3e-3 --seed 0 \
    --save "$OUT/sparse" --overwrite
/usr/bin/time -f "prune wall %e s" slimming prune --checkpoint "$OUT/sparse/last.pth" --percent 0.5 \
    --save "$OUT/pruned" --overwrite
slimming eval --checkpoint "$OUT/sparse/last.pth" "${COMMON[@]}"
slimming eval --checkpoint "$OUT/pruned/pruned.pth" "${COMMON[@]}"
slimming finetune --checkpoint "$OUT/pruned/pruned.pth" "${COMMON[@]}" --epochs 3 --lr 0.01 \
    --seed 0 --save "$OUT/ft" --overwrite
slimming eval --checkpoint "$OUT/ft/last.pth" "${COMMON[@]}"
