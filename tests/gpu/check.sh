#!/usr/bin/env bash
# GPU checks of the CUDA backend (docs/cuda.md): builds attnres_gpu_check into build-gpu/ (the
# GPU-check build, ATTNRES_GPU_CHECK_ONLY) when needed, then runs it under a time budget. Needs the
# CUDA toolkit, OpenBLAS, nlohmann-json and toml++ (scripts/install-deps.sh; on a machine without
# them: tests/gpu/device-run.sh) and one NVIDIA GPU; no network. Prints one table and exits
# non-zero when a check failed (performance targets only count with --strict).
#
#   tests/gpu/check.sh [attnres_gpu_check options: --only abcd --strict --no-m --quick --steps N]
#   BUILD_DIR=build-gpu JOBS=16 BUDGET=240 (seconds for the checks themselves)
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${BUILD_DIR:-$root/build-gpu}"
jobs="${JOBS:-16}"
budget="${BUDGET:-240}"

if ! command -v nvcc > /dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
# fp32 GEMMs request CUBLAS_COMPUTE_32F (never TF32); this rules TF32 out globally as well.
export NVIDIA_TF32_OVERRIDE=0
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"

start=$(date +%s)
if [ ! -f "$build/CMakeCache.txt" ]; then
  mkdir -p "$build"
  generator=()
  if command -v ninja > /dev/null; then generator=(-G Ninja); fi
  if ! cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DATTNRES_CUDA=ON \
      -DATTNRES_GPU_CHECK_ONLY=ON > "$build/configure.log" 2>&1; then
    cat "$build/configure.log"
    exit 1
  fi
fi
cmake --build "$build" --target attnres_gpu_check -j "$jobs" 2>&1 | grep -Ev '^\[ *[0-9]+(/[0-9]+)?%?\]' || true
test -x "$build/tests/gpu/attnres_gpu_check" || { echo "check.sh: build failed" >&2; exit 1; }
echo "check.sh: built in $(( $(date +%s) - start )) s; running (budget ${budget} s)"

set +e
timeout --signal=TERM --kill-after=15 "$budget" "$build/tests/gpu/attnres_gpu_check" "$@"
rc=$?
set -e
if [ $rc -eq 124 ]; then echo "check.sh: the checks ran past ${budget} s" >&2; fi
echo "check.sh: total $(( $(date +%s) - start )) s, exit $rc"
exit $rc
