#!/usr/bin/env bash
# CPU emulation of the CUDA backend, for working on src/cuda without a GPU (a development tool:
# not part of the default build, CI or tests/gpu/check.sh).
#
# The .cu files are rewritten (gen.py: kernel launches -> emu::launch, extern __shared__ ->
# per-launch buffers) and compiled as C++ with include/: every block runs with one real thread
# per CUDA thread, __syncthreads/__syncwarp are barriers, warp shuffles go through shared slots,
# WMMA fragments hold whole 16x16 tiles (checking pointer alignment and ldm), shared memory starts
# as NaN. The CUDA runtime is mocked with host memory (emu_runtime.cpp) and cuBLASLt is replaced by
# a CPU GEMM (emu_gemm.cpp). Blocks run one after another, so races BETWEEN blocks are not exercised.
# Slow: check (a) takes about 5 minutes on 2 cores.
#
#   tests/gpu/emu/run.sh BUILD_DIR [attnres_gpu_check options, e.g. --only a, --only bc --quick]
# BUILD_DIR: a build configured with the CUDA backend (ATTNRES_CUDA=AUTO finding nvcc, or ON; the
# full build or the GPU-check build, any generator). Builds its target attnres_gpu_emu
# (tests/gpu/emu/CMakeLists.txt; JOBS, default all cores), then runs it with OMP_NUM_THREADS=1
# unless set.
set -euo pipefail
build="$(cd "${1:?usage: run.sh BUILD_DIR [check options]}" && pwd)"
shift
# The target list is captured whole: `... | grep -q` would close the pipe at the first match, and
# make, killed by SIGPIPE, fails the pipeline under pipefail ("no target" on a build that has it).
targets="$(cmake --build "$build" --target help 2> /dev/null || true)"
if ! grep -q attnres_gpu_emu <<< "$targets"; then
  echo "run.sh: $build has no attnres_gpu_emu target: configure it with the CUDA backend (and python3)" >&2
  exit 1
fi
cmake --build "$build" --target attnres_gpu_emu -j "${JOBS:-$(nproc)}" 2>&1 | grep -Ev '^\[ *[0-9]+(/[0-9]+)?%?\]' || true
test -x "$build/tests/gpu/emu/attnres_gpu_emu" || { echo "run.sh: the emulator build failed" >&2; exit 1; }
OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" "$build/tests/gpu/emu/attnres_gpu_emu" "$@"
