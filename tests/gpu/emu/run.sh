#!/usr/bin/env bash
# CPU emulation of the CUDA backend, for working on src/cuda without a GPU (a development tool:
# not part of the build, CI or tests/gpu/check.sh).
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
# BUILD_DIR: a configured build whose CPU libraries and tests are built (make test / cmake --build);
# the CUDA toolkit's headers must be installed (CUDA_HOME, default /usr/local/cuda).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
build="$(cd "${1:?usage: run.sh BUILD_DIR [check options]}" && pwd)"
shift
cuda="${CUDA_HOME:-/usr/local/cuda}"
out="$build/gpu-emu"
mkdir -p "$out/gen" "$out/obj"
link_txt="$build/tests/model/CMakeFiles/test_model.dir/link.txt"
test -f "$link_txt" || { echo "run.sh: $link_txt not found: build the CPU tests in $build first" >&2; exit 1; }
for f in ops depth_read attention; do python3 "$here/gen.py" "$root/src/cuda/$f.cu" "$out/gen/$f.cpp" > /dev/null; done
flags=(-std=c++20 -O2 -fopenmp -I"$here/include" -I"$cuda/include" -I"$root/src" -I"$root/tests" -DATTNRES_WITH_CUDA=1
       -Wall -Wextra -Wno-unused-parameter -Wno-unknown-pragmas)
sources=("$out"/gen/*.cpp "$here/emu_runtime.cpp" "$here/emu_gemm.cpp" "$root/src/cuda/check.cpp" "$root/src/cuda/buffer.cpp"
         "$root/src/cuda/cuda_model.cpp" "$root/src/cuda/cuda_model_passes.cpp" "$root/src/cuda/cuda_adamw.cpp"
         "$root/src/cuda/collective.cpp" "$root/tests/gpu/check_main.cpp")
objects=()
for f in "${sources[@]}"; do
  o="$out/obj/$(basename "$f" .cpp).o"
  objects+=("$o")
  if [ ! -f "$o" ] || [ "$f" -nt "$o" ] || [ "$here/include/emu_device.hpp" -nt "$o" ] || [ "$here/include/emu_mma.h" -nt "$o" ]; then
    echo "compiling $(basename "$f")"
    g++ "${flags[@]}" -c "$f" -o "$o"
  fi
done
# The CPU libraries and system libraries of an existing test executable's link line.
libs=$(sed -e 's/.* -o test_model //' "$link_txt")
(cd "$build/tests/model" && g++ -fopenmp -o "$out/emu_check" "${objects[@]}" -Wl,--start-group $libs -Wl,--end-group)
OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" "$out/emu_check" "$@"
