#!/usr/bin/env bash
# Where the CUDA backend's training step spends its time, and whether its kernels touch memory
# they should not (docs/cuda.md "Profiling on the GPU machine"). Runs on the GPU machine after
# tests/gpu/device-run.sh has built attnres_gpu_check (GPU_SCRATCH=DIR puts the build in DIR/build):
#
#   1. Nsight Compute (ncu --clock-control none, one metric: gpu__time_duration.sum) over one
#      training step of preset S in bf16, block and rd (attnres_gpu_check --only d --no-m
#      --perf-warmup 0 --perf-steps 1); kernels.csv, and tests/gpu/kernel_times.py's table of the
#      step time by kernel family per arm;
#   2. compute-sanitizer memcheck over checks (a), (b) without preset S, and (c): every mode,
#      small models, fp32 and bf16, the FMA and the tensor-core attention kernels;
#   3. compute-sanitizer racecheck over check (b) without preset S (shared-memory hazards).
#
#   tests/gpu/profile.sh BUILD_DIR OUT_DIR [NCU_S=200] [MEMCHECK_S=120] [RACECHECK_S=90]
#   PROFILE_CHECK_ARGS="--attention cudnn" (extra attnres_gpu_check options for the ncu step, e.g.
#   the attention implementation: auto, cudnn or wmma)
# Each part runs under its own timeout (0 skips it); the exit status is 0 when every part that
# ran finished and the sanitizers found nothing. A part stopped at its timeout prints the check's
# last rows, so that one sees how far it got.
set -uo pipefail

if [ $# -lt 2 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
  sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 2
fi
build="$1"
out="$2"
ncu_s="${3:-200}"
memcheck_s="${4:-120}"
racecheck_s="${5:-90}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
check="$build/tests/gpu/attnres_gpu_check"
mkdir -p "$out"
test -x "$check" || { echo "profile: no $check (run tests/gpu/device-run.sh first)" >&2; exit 2; }
export NVIDIA_TF32_OVERRIDE=0

find_tool() {
  command -v "$1" 2> /dev/null && return 0
  local f
  for f in /usr/local/cuda/bin/"$1" /opt/nvidia/nsight-compute/*/"$1" /usr/local/cuda/compute-sanitizer/"$1"; do
    if [ -x "$f" ]; then echo "$f"; return 0; fi
  done
  return 1
}
fail=0

if [ "$ncu_s" = 0 ]; then
  echo "profile: 1. ncu skipped"
elif ncu=$(find_tool ncu); then
  echo "profile: 1. ncu, one step of preset S (bf16), block and rd ${PROFILE_CHECK_ARGS:-}"
  t0=$(date +%s)
  # shellcheck disable=SC2086  # PROFILE_CHECK_ARGS is a list of options
  timeout --kill-after=10 "$ncu_s" "$ncu" --clock-control none --metrics gpu__time_duration.sum \
    --print-kernel-base function -f -o "$out/step" \
    "$check" --only d --no-m --perf-warmup 0 --perf-steps 1 --peak-tflops 894 --modes block,rd ${PROFILE_CHECK_ARGS:-} > "$out/ncu.log" 2>&1
  rc=$?
  echo "profile: ncu exit $rc after $(( $(date +%s) - t0 )) s"
  if [ -f "$out/step.ncu-rep" ]; then
    "$ncu" -i "$out/step.ncu-rep" --csv --print-units base --print-kernel-base function > "$out/kernels.csv" 2>> "$out/ncu.log"
    python3 "$root/tests/gpu/kernel_times.py" "$out/kernels.csv" | tee "$out/kernel-times.txt" || fail=1
  else
    echo "profile: ncu wrote no report"; tail -n 20 "$out/ncu.log"; fail=1
  fi
else
  echo "profile: ncu not found"; fail=1
fi

sanitize() {
  local tool="$1" limit="$2"
  shift 2
  local cs t0 rc
  if [ "$limit" = 0 ]; then echo "profile: $tool skipped"; return 0; fi
  cs=$(find_tool compute-sanitizer) || { echo "profile: compute-sanitizer not found"; return 1; }
  t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$cs" --tool "$tool" --error-exitcode 99 "$check" "$@" > "$out/$tool.log" 2>&1
  rc=$?
  echo "profile: $tool exit $rc after $(( $(date +%s) - t0 )) s ($*)"
  grep -E '========= (ERROR SUMMARY|RACECHECK SUMMARY)|^summary:' "$out/$tool.log" | sed 's/^/  /'
  case $rc in
    0) return 0 ;;
    124 | 137)
      echo "  (stopped at ${limit} s: what ran found $(grep -c '^========= .*\(Invalid\|hazard\|Race\)' "$out/$tool.log") reports; its last rows:)"
      grep -E '^  [a-d] ' "$out/$tool.log" | tail -n 3 | sed 's/^/  /'
      return 1 ;;
    *) grep -m 20 -E '^========= ' "$out/$tool.log" | sed 's/^/  /'; return 1 ;;
  esac
}
echo "profile: 2. compute-sanitizer memcheck, checks (a), (b) and (c)"
sanitize memcheck "$memcheck_s" --only abc --quick --steps 2 || fail=1
echo "profile: 3. compute-sanitizer racecheck, check (b)"
sanitize racecheck "$racecheck_s" --only b --quick || fail=1
exit "$fail"
