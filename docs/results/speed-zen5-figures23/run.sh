#!/bin/sh
# Figures 2 and 3 of issue #32 on the sixth session's VM (docs/performance.md, "Update,
# 2026-12-05"). Run from the repository root after `make build`; OPENBLAS_CORETYPE unset.
set -eu
unset OPENBLAS_CORETYPE
A=build/src/cli/attnres C=bench/configs R=docs/results/speed-zen5-figures23
lscpu > $R/lscpu.txt
O="--config $C/study-d64x12.toml --arms block --precision fp32 --torch off --no-paired --steps 30 --warmup 2"
for i in 1 2; do
  $A bench $O --threads 1 > $R/S4-alone-$i.txt 2>&1
  ($A bench $O --threads 1 > $R/S4-pair-$i-a.txt 2>&1 & $A bench $O --threads 1 > $R/S4-pair-$i-b.txt 2>&1; wait)
  $A bench $O --threads 2 > $R/S4-two-threads-$i.txt 2>&1
done
$A bench --preset small --arms block,rd --threads 1 --precision bf16 --torch on --seq 256 --steps 6 --warmup 1 \
  > $R/T3.txt 2>&1
