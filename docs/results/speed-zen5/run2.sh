#!/bin/bash
unset OPENBLAS_CORETYPE
cd /work/main
A=build/src/cli/attnres; C=bench/configs; O=/tmp/b2
while [ ! -f $O/DONE ]; do sleep 5; done
build/bench/attnres_gemm_f32_bench --filter d64 --reps 100 --cold-all > $O/G4-d64-cold.txt 2>&1
for i in 1 2; do for g in avx512 avx2; do
  OPENBLAS_CORETYPE=Haswell ATTNRES_FP32_GEMM=$g $A bench --config $C/study-d64x12.toml --arms block,rd --threads 1 --precision fp32 --torch off --no-paired --steps 20 --warmup 2 --json-file $O/S6-haswell-$g-$i.json > $O/S6-haswell-$g-$i.txt 2>&1
done; done
P="--config $C/study-d64x12.toml --arms block --precision fp32 --torch off --no-paired --steps 30 --warmup 2"
for g in openblas avx512; do
  ATTNRES_FP32_GEMM=$g $A bench $P --threads 1 --json-file $O/S7-$g-alone.json > $O/S7-$g-alone.txt 2>&1
  (ATTNRES_FP32_GEMM=$g $A bench $P --threads 1 --json-file $O/S7-$g-pair-a.json > $O/S7-$g-pair-a.txt 2>&1 & ATTNRES_FP32_GEMM=$g $A bench $P --threads 1 --json-file $O/S7-$g-pair-b.json > $O/S7-$g-pair-b.txt 2>&1; wait)
done
echo done > $O/DONE2
