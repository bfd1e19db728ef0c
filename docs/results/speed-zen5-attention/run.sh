#!/bin/bash
# Fifth session's measurements (final binary), sequential. OPENBLAS_CORETYPE unset.
unset OPENBLAS_CORETYPE
cd /work/main
A=build/src/cli/attnres; C=bench/configs; O=/tmp/m2
lscpu > $O/lscpu.txt
for i in 1 2 3; do for side in old new; do
  B=/work/$([ $side = old ] && echo old || echo main)/build/src/cli/attnres
  $B bench --config $C/study-d64x12.toml --arms block,rd --precision fp32 --threads 1 --steps 30 --warmup 2 --torch off --no-paired > $O/AB-d64-$side-$i.txt 2>&1
done; done
$A bench --preset small --arms block,rd --threads 1 --precision fp32 --seq 256,4096 --steps 3 --warmup 1 --no-paired --torch off --json-file $O/T4.json > $O/T4.txt 2>&1
$A bench --config $C/study-d64x12.toml --arms block,rd --threads 1 --precision fp32 --torch on --steps 20 --warmup 2 --json-file $O/S1.json > $O/S1-d64.txt 2>&1
$A bench --config $C/study-d128x8.toml --arms block,rd --threads 1 --precision fp32 --torch on --steps 20 --warmup 2 --json-file $O/S2.json > $O/S2-d128.txt 2>&1
$A bench --config $C/study-d64x12.toml --arms block,rd --threads 1 --precision fp32 --torch off --steps 40 --warmup 2 --rounds 5 > $O/S5-rounds.txt 2>&1
echo done > $O/DONE
