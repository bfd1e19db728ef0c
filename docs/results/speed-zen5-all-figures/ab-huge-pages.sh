#!/bin/sh
# Step times with 4 KB pages (OLD = main at 41172f5) and huge pages (NEW = d090adc), alternating:
# d64x12 block and rd in separate processes, 30 steps each. OPENBLAS_CORETYPE unset.
set -eu
unset OPENBLAS_CORETYPE
OLD=${OLD:-/tmp/attnres-old} NEW=${NEW:-build/src/cli/attnres} R=docs/results/speed-zen5-all-figures
for i in 1 2 3 4; do
  for v in old new; do
    b=$OLD; [ $v = new ] && b=$NEW
    "$b" bench --config bench/configs/study-d64x12.toml --arms block,rd --precision fp32 --threads 1 --torch off \
      --no-paired --steps 30 --warmup 2 > $R/AB-steps-$v-$i.txt 2>&1
  done
done
