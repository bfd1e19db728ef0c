#!/usr/bin/env bash
# Data-parallel training throughput: the same training job (preset `small` by default, 8 steps
# of 16 x 256 tokens) as one process and as 2 MPI ranks, tokens/s from each run's
# train_result.json, plus the share of step time spent in the gradient reduction.
#   1 process x T threads   vs   2 ranks x T/2 threads   (same cores, same global batch)
# Usage: bench/mpi_bench.sh [ATTNRES_BINARY] [DATA_DIR]
# Defaults: build/src/cli/attnres and data/python-docs (prepared by `make demo`, or
# `attnres prepare --out data/python-docs`). Environment: PRESET (small), STEPS (8),
# THREADS (cores), RANKS (2), MPIRUN (mpirun --allow-run-as-root --oversubscribe).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${1:-$root/build/src/cli/attnres}"
data="${2:-$root/data/python-docs}"
preset="${PRESET:-small}"
steps="${STEPS:-8}"
threads="${THREADS:-$(nproc)}"
ranks="${RANKS:-2}"
mpirun_cmd="${MPIRUN:-mpirun --allow-run-as-root --oversubscribe}"
[ -x "$bin" ] || { echo "mpi_bench: no attnres binary at $bin (build it, or pass its path)" >&2; exit 1; }
[ -f "$data/manifest.json" ] || { echo "mpi_bench: no prepared data in $data (attnres prepare --out $data)" >&2; exit 1; }
(( threads % ranks == 0 )) || { echo "mpi_bench: THREADS ($threads) must be a multiple of RANKS ($ranks)" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
batch=16; seq=256
common=(--preset "$preset" --set train.batch_size=$batch --set train.seq_len=$seq
        --set "train.tokens=$((steps * batch * seq))" --set "train.milestones=[1.0]"
        --set train.eval_tokens=$((seq + 1)) --set train.checkpoint_every=100000
        --set "train.micro_batches=$ranks")

run() {  # label, out, threads per process, launcher...
  local label="$1" out="$2" per="$3"; shift 3
  "$@" train "${common[@]}" --set "train.threads=$per" --data "$data" --out "$out" > "$out.log" 2>&1 ||
    { echo "mpi_bench: $label failed; log:" >&2; cat "$out.log" >&2; exit 1; }
}
echo "mpi_bench: preset $preset, $steps steps of $batch x $seq tokens, $threads cores, $ranks micro-batches"
run "1 process" "$work/one" "$threads" "$bin"
run "$ranks ranks" "$work/many" "$((threads / ranks))" $mpirun_cmd -np "$ranks" "$bin"

python3 - "$work/one" "$work/many" "$ranks" "$threads" <<'PY'
import json, sys
one, many, ranks, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
a = json.load(open(one + "/train_result.json")); b = json.load(open(many + "/train_result.json"))
same = open(one + "/model.safetensors", "rb").read() == open(many + "/model.safetensors", "rb").read()
print(f"| layout | tokens/s | step ms | reduction share |")
print(f"|---|---|---|---|")
print(f"| 1 process x {threads} threads | {a['tokens_per_sec']:.0f} | {a['step_time_ms']:.0f} | - |")
print(f"| {ranks} ranks x {threads // ranks} threads | {b['tokens_per_sec']:.0f} | {b['step_time_ms']:.0f} | {100 * b['reduce_fraction']:.1f}% |")
print(f"ratio ({ranks} ranks / 1 process): {b['tokens_per_sec'] / a['tokens_per_sec']:.2f}x; "
      f"final weights bit-identical: {'yes' if same else 'no (different threads per process round differently)'}")
PY
