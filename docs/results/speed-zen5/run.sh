#!/bin/bash
# #32 measurements, 2026-12-04, fourth session; OPENBLAS_CORETYPE unset (the machine's own core).
unset OPENBLAS_CORETYPE
cd /work/main
A=build/src/cli/attnres; C=bench/configs; O=/tmp/b2
lscpu > $O/lscpu.txt; uptime > $O/uptime-start.txt
build/bench/attnres_gemm_f32_bench --filter d64 --reps 200 > $O/G1-d64.txt 2>&1
build/bench/attnres_gemm_f32_bench --filter d128 --reps 100 > $O/G2-d128.txt 2>&1
build/bench/attnres_gemm_f32_bench --filter attn --reps 200 > $O/G3-attn.txt 2>&1
$A bench --config $C/study-d64x12.toml --arms block,rd --threads 1 --precision fp32 --torch on --steps 20 --warmup 2 --json-file $O/S1-d64.json > $O/S1-d64.txt 2>&1
$A bench --config $C/study-d128x8.toml --arms block,rd --threads 1 --precision fp32 --torch on --steps 20 --warmup 2 --json-file $O/S2-d128.json > $O/S2-d128.txt 2>&1
for i in 1 2 3; do for g in openblas avx512; do
  ATTNRES_FP32_GEMM=$g $A bench --config $C/study-d64x12.toml --arms block,rd --threads 1 --precision fp32 --torch off --no-paired --steps 30 --warmup 2 --json-file $O/S3-$g-$i.json > $O/S3-$g-$i.txt 2>&1
done; done
P="--config $C/study-d64x12.toml --arms block --precision fp32 --torch off --no-paired --steps 30 --warmup 2"
$A bench $P --threads 1 --json-file $O/S4-alone.json > $O/S4-alone.txt 2>&1
($A bench $P --threads 1 --json-file $O/S4-pair-a.json > $O/S4-pair-a.txt 2>&1 & $A bench $P --threads 1 --json-file $O/S4-pair-b.json > $O/S4-pair-b.txt 2>&1; wait)
$A bench $P --threads 2 --json-file $O/S4-two-threads.json > $O/S4-two-threads.txt 2>&1
$A bench --config $C/study-d64x12.toml --arms block,rd --threads 1 --precision fp32 --torch off --steps 40 --warmup 2 --rounds 5 --json-file $O/S5-rounds.json > $O/S5-rounds.txt 2>&1
$A bench --preset small --arms block,rd --threads 1 --precision fp32 --torch on --seq 256,4096 --steps 3 --warmup 1 --no-paired --json-file $O/T4.json > $O/T4.txt 2>&1
$A bench --preset small --arms block,rd --threads 1 --precision bf16 --torch on --seq 256 --steps 6 --warmup 1 --json-file $O/T3.json > $O/T3.txt 2>&1
uptime > $O/uptime-end.txt
echo done > $O/DONE
