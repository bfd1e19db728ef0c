#!/bin/sh
# Issue #32's five figures in one sitting, torch eager in the same `attnres bench` runs, and where
# each step's time goes (docs/performance.md, "All five figures on AMD Zen 5, one sitting").
# Run from the repository root after `make build`, on an otherwise idle machine; OPENBLAS_CORETYPE
# unset for both sides. About 30 minutes on 2 cores.
set -eu
unset OPENBLAS_CORETYPE
A=build/src/cli/attnres C=bench/configs R=docs/results/speed-zen5-all-figures
lscpu > $R/lscpu.txt
git rev-parse HEAD > $R/commit.txt

# Figures 1, 5 and 5b: model FLOP/s against the same run's sgemm, rd / block paired, peak memory.
$A bench --config $C/study-d64x12.toml --arms block,rd --threads 1 --precision fp32 --torch on --steps 20 --warmup 2 \
  > $R/F1-d64x12.txt 2>&1
$A bench --config $C/study-d128x8.toml --arms block,rd --threads 1 --precision fp32 --torch on --steps 20 --warmup 2 \
  > $R/F1-d128x8.txt 2>&1
# Figure 5 across processes (single processes scatter by more than their own intervals).
$A bench --config $C/study-d64x12.toml --arms block,rd --threads 1 --precision fp32 --torch off --steps 40 \
  --warmup 2 --rounds 5 > $R/F5-d64x12-rounds.txt 2>&1

# Figure 2: one run alone, two side by side, one run on two threads (twice).
O="--config $C/study-d64x12.toml --arms block --precision fp32 --torch off --no-paired --steps 30 --warmup 2"
for i in 1 2; do
  $A bench $O --threads 1 > $R/F2-alone-$i.txt 2>&1
  ($A bench $O --threads 1 > $R/F2-pair-$i-a.txt 2>&1 & $A bench $O --threads 1 > $R/F2-pair-$i-b.txt 2>&1; wait)
  $A bench $O --threads 2 > $R/F2-two-threads-$i.txt 2>&1
done

# Figure 3: `small`, bf16, T = 256 (torch: autocast bf16).
$A bench --preset small --arms block,rd --threads 1 --precision bf16 --torch on --seq 256 --steps 6 --warmup 1 \
  > $R/F3-small-bf16.txt 2>&1
# Figure 4: `small`, fp32, T = 4096 against T = 256.
$A bench --preset small --arms block,rd --threads 1 --precision fp32 --torch on --seq 256,4096 --steps 3 --warmup 1 \
  --no-paired > $R/F4-small-T4096.txt 2>&1

# Where the steps' time goes: each command profiled with few and with many steps; the difference
# is the steps' own profile (scripts/perf_step_shares.py).
profile() {  # name, short steps, long steps, bench arguments...
  name=$1 short=$2 long=$3; shift 3
  perf record -q -e cpu-clock -F 999 -o /tmp/$name-short.data -- $A bench "$@" --steps $short > /dev/null 2>&1
  perf record -q -e cpu-clock -F 999 -o /tmp/$name-long.data -- $A bench "$@" --steps $long > /dev/null 2>&1
  scripts/perf_step_shares.py /tmp/$name-short.data /tmp/$name-long.data --top 30 > $R/P-$name.txt
}
P="--threads 1 --torch off --no-paired --warmup 1"
profile d64x12-block 5 45 --config $C/study-d64x12.toml --arms block --precision fp32 $P
profile d64x12-rd 5 45 --config $C/study-d64x12.toml --arms rd --precision fp32 $P
profile d128x8-block 5 35 --config $C/study-d128x8.toml --arms block --precision fp32 $P
profile small-bf16 3 13 --preset small --arms block --precision bf16 --seq 256 $P
profile small-fp32-T4096 1 5 --preset small --arms block --precision fp32 --seq 4096 $P
