#!/bin/sh
# Figure 5, old and new binaries alternating (paired rd / block in one process, 30 step pairs):
# OLD = main at 41172f5 (4 KB pages), NEW = d090adc (huge pages). OPENBLAS_CORETYPE unset.
set -eu
unset OPENBLAS_CORETYPE
OLD=${OLD:-/tmp/attnres-old} NEW=${NEW:-build/src/cli/attnres} R=docs/results/speed-zen5-all-figures
for i in 1 2 3; do
  for v in old new; do
    b=$OLD; [ $v = new ] && b=$NEW
    "$b" bench --config bench/configs/study-d64x12.toml --arms block,rd --precision fp32 --threads 1 --torch off \
      --steps 30 --warmup 2 > $R/AB-F5-$v-$i.txt 2>&1
  done
done
