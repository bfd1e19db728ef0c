#!/bin/bash
# The raw outputs of docs/performance.md, "Update, 2026-12-05, seventh session". OLD and NEW are
# two builds of build/src/cli/attnres (0566860 and efa4b41); OPENBLAS_CORETYPE unset.
set -euo pipefail
OLD=${OLD:-/tmp/attnres-old} NEW=${NEW:-/tmp/attnres-new}
OUT=$(dirname "$0")
unset OPENBLAS_CORETYPE
lscpu > "$OUT/lscpu.txt"
for round in 1 2 3; do  # step times, old and new alternating
  for v in old new; do
    bin=$OLD; [ $v = new ] && bin=$NEW
    "$bin" bench --config bench/configs/study-d64x12.toml --arms block,rd --precision fp32 --threads 1 --torch off \
      --no-paired --steps 30 --warmup 2 > "$OUT/AB-d64-$v-$round.txt" 2>&1
  done
done
for round in 1 2; do  # figure 3: small, bf16, T = 256
  for v in old new; do
    bin=$OLD; [ $v = new ] && bin=$NEW
    "$bin" bench --preset small --arms block,rd --threads 1 --precision bf16 --torch off --seq 256 --steps 8 \
      --warmup 1 --no-paired > "$OUT/T3-$v-$round.txt" 2>&1
  done
done
for v in old new; do  # where a d64x12 block step goes
  bin=$OLD; [ $v = new ] && bin=$NEW
  perf record -e cpu-clock -F 999 -o /tmp/perf-$v.data "$bin" bench --config bench/configs/study-d64x12.toml \
    --arms block --precision fp32 --threads 1 --torch off --no-paired --steps 30 --warmup 2 > /dev/null 2>&1
  perf report -i /tmp/perf-$v.data --no-children --sort symbol | grep -v '^#' | grep -v '^$' | head -40 \
    > "$OUT/perf-d64-block-$v.txt"
done
build/bench/attnres_elementwise_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only \
  > "$OUT/elementwise-bench.txt" 2>&1
