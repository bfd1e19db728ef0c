#!/usr/bin/env bash
# Fuzzes each target of build-fuzz's attnres_fuzz for SECONDS seconds (`make fuzz`):
#   fuzz/run.sh BUILD SECONDS [TARGET...]      (default: every target)
# Each target starts from its seeds (written by the binary, from attnres's own writers), its saved
# findings in fuzz/regressions/TARGET and the corpus grown by earlier runs in BUILD/fuzz-corpus.
# A crash, sanitizer report, oracle failure or hang (> 10 s on one input) fails the run; the input
# is saved in BUILD/fuzz-artifacts/TARGET/ with the command that replays it. Fix the bug, then keep
# the input as fuzz/regressions/TARGET/<short-name> so `make test` runs it from then on.
# FUZZ_JOBS=N runs N targets at a time (default: the number of cores).
set -euo pipefail
build=${1:?usage: fuzz/run.sh BUILD SECONDS [TARGET...]}
seconds=${2:?usage: fuzz/run.sh BUILD SECONDS [TARGET...]}
shift 2
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$(cd "$build" && pwd)/fuzz/attnres_fuzz
[ -x "$bin" ] || { echo "fuzz: $bin is not built (run 'make fuzz')" >&2; exit 1; }
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then mapfile -t targets < <(ATTNRES_FUZZ_TARGET=list "$bin"); fi

# The parsers read small files: keep them in memory when /dev/shm is there.
if [ -d /dev/shm ] && [ -w /dev/shm ]; then export TMPDIR=/dev/shm; fi
export OMP_NUM_THREADS=1
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:halt_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

# The targets run side by side, FUZZ_JOBS at a time (default: one per core), each on one core.
jobs=${FUZZ_JOBS:-$(nproc)}
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || { echo "fuzz: FUZZ_JOBS must be a positive integer (got '$jobs')" >&2; exit 1; }
# Fuzzes one target; its report goes to fuzz-logs/TARGET.report, its outcome to TARGET.failed.
fuzz_one() {
  local t=$1
  local corpus="$build/fuzz-corpus/$t" seeds="$build/fuzz-seeds/$t" artifacts="$build/fuzz-artifacts/$t"
  local log="$build/fuzz-logs/$t.log" report="$build/fuzz-logs/$t.report"
  rm -f "$report" "$build/fuzz-logs/$t.failed"
  rm -rf "$seeds"
  if ! ATTNRES_FUZZ_TARGET=$t ATTNRES_FUZZ_SEEDS=$seeds "$bin" > "$log" 2>&1; then
    echo "fuzz: $t: FAILED writing its seeds (log: $log)" > "$report"
    touch "$build/fuzz-logs/$t.failed"
    return 0
  fi
  if ATTNRES_FUZZ_TARGET=$t "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
       -artifact_prefix="$artifacts/" -print_final_stats=1 \
       "$corpus" "$seeds" "$root/fuzz/regressions/$t" > "$log" 2>&1; then
    local runs cov
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 || true)
    echo "fuzz: $t: ok, ${runs:-?} inputs in ${seconds} s, ${cov:-cov: ?}" > "$report"
  else
    touch "$build/fuzz-logs/$t.failed"
    {
      echo "fuzz: $t: FAILED (log: $log)"
      grep -E "ERROR|WARNING|fuzz oracle|runtime error|terminate|Test unit written|SUMMARY" "$log" | head -20 || true
      for a in "$artifacts"/*; do
        if [ -f "$a" ]; then echo "  replay: ATTNRES_FUZZ_TARGET=$t $bin $a"; fi
      done
    } > "$report"
  fi
}

for t in "${targets[@]}"; do
  mkdir -p "$build/fuzz-corpus/$t" "$build/fuzz-artifacts/$t" "$build/fuzz-logs" "$root/fuzz/regressions/$t"
done
running=0
for t in "${targets[@]}"; do
  if (( running >= jobs )); then wait -n || true; running=$((running - 1)); fi
  fuzz_one "$t" &
  running=$((running + 1))
done
wait || true

failed=()
for t in "${targets[@]}"; do
  cat "$build/fuzz-logs/$t.report" 2>/dev/null || echo "fuzz: $t: FAILED (no report: the run did not finish)"
  if [ -e "$build/fuzz-logs/$t.failed" ] || [ ! -e "$build/fuzz-logs/$t.report" ]; then failed+=("$t"); fi
done
if [ ${#failed[@]} -ne 0 ]; then
  echo "fuzz: findings in: ${failed[*]}" >&2
  exit 1
fi
