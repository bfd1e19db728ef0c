#!/usr/bin/env bash
# The GPU checks on a bare GPU machine (docs/cuda.md "Running on a bare GPU machine"): nvcc,
# CMake and a C++ compiler are there, none of the Debian packages attnres builds against, and no
# network. Unpacks the bundle of scripts/gpu-bundle.sh (.gpu/bundle, carried with the tree) into
# a scratch prefix, configures the GPU-check build (ATTNRES_GPU_CHECK_ONLY: no SentencePiece,
# zlib, CLI11, MPI, GoogleTest) against that prefix only, builds attnres_gpu_check with every
# core, and runs tests/gpu/check.sh in what is left of the time budget.
#
#   tests/gpu/device-run.sh OUT_DIR [BUDGET_S] [attnres_gpu_check options, e.g. --no-m]
#
# BUDGET_S (default 480) bounds the whole run, build included; the checks get what is left less
# 15 s for the logs. OUT_DIR receives, whatever happens:
#   summary.txt        result, the failed phase, timings, the table (also printed at the end)
#   table.txt          the checks' table (tests/gpu/check_main.cpp)
#   timings.tsv        wall and CPU seconds and exit status per phase (env unpack configure build checks)
#   env.txt            OS, glibc, compiler, CMake, ninja, nvcc, driver, cores, memory
#   nvidia-smi.txt     nvidia-smi, and nvidia-smi-trace.csv (utilisation, memory, power each second of the checks)
#   unpack.log configure.log build.log checks.log, cmake-cache.txt, ninja-log.txt, ldd.txt
# Exit status: 0 when every check passed, else the failed phase's status (checks: 1 a check
# failed, 2 no CUDA device, 124 past the budget).
#
# Environment: GPU_BUNDLE (default .gpu/bundle), GPU_SCRATCH (default a new /tmp/attnres-gpu.*),
# EXTRA_CMAKE_ARGS (appended to the configure), DEB_EXTRACT=dpkg|ar|python (how .deb files are
# unpacked; default the first available), DEVICE_RUN_EMULATE=1 (run the checks under the CPU
# emulator tests/gpu/emu/run.sh instead: a rehearsal without a GPU).
set -uo pipefail

if [ $# -lt 1 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
  sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 2
fi
root="$(cd "$(dirname "$0")/../.." && pwd)"
mkdir -p "$1" || exit 2
out="$(cd "$1" && pwd)"
budget="${2:-480}"
shift $(($# >= 2 ? 2 : 1))
check_args=("$@")
case "$budget" in '' | *[!0-9]*) echo "device-run: BUDGET_S must be whole seconds, not '$budget'" >&2; exit 2 ;; esac

bundle="${GPU_BUNDLE:-$root/.gpu/bundle}"
scratch="${GPU_SCRATCH:-$(mktemp -d "${TMPDIR:-/tmp}/attnres-gpu.XXXXXX")}"
prefix="$scratch/prefix"
build="$scratch/build"
jobs=$(nproc)
reserve=15
t0=$(date +%s.%N)
elapsed() { awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.0f", b - a}'; }

rm -f "$out"/*.log "$out"/{summary.txt,table.txt,timings.tsv,status}
printf 'phase\twall_s\tcpu_s\texit\n' > "$out/timings.tsv"
failed_phase=""
failed_rc=0
monitor_pid=""

# phase NAME COMMAND...: runs COMMAND with its output in NAME.log; records its wall time, its CPU
# time (user + system, children included) and its exit status.
phase() {
  local name="$1" rc times TIMEFORMAT='%R %U %S'
  shift
  { time "$@" > "$out/$name.log" 2>&1; } 2> "$scratch/phase-time"
  rc=$?
  times=$(tail -n 1 "$scratch/phase-time")
  printf '%s\t%s\t%s\t%s\n' "$name" "$(echo "$times" | awk '{printf "%.1f", $1}')" \
    "$(echo "$times" | awk '{printf "%.1f", $2 + $3}')" "$rc" >> "$out/timings.tsv"
  echo "device-run: $name: exit $rc ($(echo "$times" | awk '{printf "%.1f s, CPU %.1f s", $1, $2 + $3}'); $(elapsed) s in all)"
  if [ "$rc" -ne 0 ] && [ -z "$failed_phase" ]; then
    failed_phase="$name"
    failed_rc=$rc
  fi
  return "$rc"
}

finish() {
  if [ -n "$monitor_pid" ]; then kill "$monitor_pid" 2> /dev/null; wait "$monitor_pid" 2> /dev/null; fi
  if [ -f "$build/CMakeCache.txt" ]; then cp "$build/CMakeCache.txt" "$out/cmake-cache.txt"; fi
  if [ -f "$build/.ninja_log" ]; then cp "$build/.ninja_log" "$out/ninja-log.txt"; fi
  if [ -x "$build/tests/gpu/attnres_gpu_check" ]; then ldd "$build/tests/gpu/attnres_gpu_check" > "$out/ldd.txt" 2>&1; fi
  if [ -f "$out/checks.log" ]; then
    # The table: from the device line (or the no-device message) to the summary line.
    sed -n '/^device 0:\|^attnres_gpu_check: no CUDA device/,/^summary:/p' "$out/checks.log" > "$out/table.txt"
  fi
  {
    if [ -z "$failed_phase" ]; then echo "result: ok"; else echo "result: failed in $failed_phase (exit $failed_rc)"; fi
    echo "bundle: $bundle; prefix: $prefix; build: $build; jobs: $jobs; budget: $budget s; total: $(elapsed) s"
    echo
    column -t -s $'\t' "$out/timings.tsv" 2> /dev/null || cat "$out/timings.tsv"
    if [ -s "$out/table.txt" ]; then echo; cat "$out/table.txt"; fi
  } > "$out/summary.txt"
  if [ -n "$failed_phase" ] && [ "$failed_phase" != checks ] && [ -f "$out/$failed_phase.log" ]; then
    echo "device-run: the last lines of $failed_phase.log:"
    tail -n 60 "$out/$failed_phase.log"
  fi
  echo "---- $out/summary.txt"
  cat "$out/summary.txt"
}
trap finish EXIT

write_env() {
  echo "date: $(date -u +%FT%TZ)"
  echo "host: $(uname -a)"
  if [ -f /etc/os-release ]; then grep -E '^(PRETTY_NAME|VERSION_ID)=' /etc/os-release; fi
  echo "glibc: $(ldd --version 2>&1 | head -n 1)"
  echo "cores: $jobs; memory: $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
  for tool in c++ g++ gcc cmake ninja nvcc python3; do
    if command -v "$tool" > /dev/null; then echo "$tool: $(command -v "$tool"): $("$tool" --version 2>&1 | grep -m1 -E '[0-9]+\.[0-9]+')"
    else echo "$tool: not found"; fi
  done
  for tool in dpkg-deb ar xz tar; do echo "$tool: $(command -v "$tool" || echo 'not found')"; done
  echo "CUDA_HOME=${CUDA_HOME:-} CUDACXX=${CUDACXX:-}"
  df -h "$scratch" | tail -n 1
  return 0
}

# Unpacks every .deb of the bundle's MANIFEST (checked against its sha256) into the prefix.
unpack() {
  test -f "$bundle/MANIFEST" || { echo "no $bundle/MANIFEST: run scripts/gpu-bundle.sh and carry .gpu/bundle"; return 1; }
  local machine arch
  machine=$(uname -m)
  case "$machine" in x86_64) arch=amd64 ;; aarch64) arch=arm64 ;; *) arch="$machine" ;; esac
  local method="${DEB_EXTRACT:-}"
  if [ -z "$method" ]; then
    if command -v dpkg-deb > /dev/null; then method=dpkg; elif command -v ar > /dev/null; then method=ar; else method=python; fi
  fi
  echo "extracting with: $method"
  rm -rf "$prefix"
  mkdir -p "$prefix"
  local pkg version deb_arch sha file
  while read -r pkg version deb_arch sha file; do
    if [ "$deb_arch" != all ] && [ "$deb_arch" != "$arch" ]; then
      echo "$file is for $deb_arch, this machine is $machine ($arch)"
      return 1
    fi
    echo "$sha  $bundle/$file" | sha256sum -c --quiet - || { echo "$file: sha256 mismatch"; return 1; }
    echo "$pkg $version"
    case "$method" in
      dpkg) dpkg-deb -x "$bundle/$file" "$prefix" || return 1 ;;
      ar)
        local member
        member=$(ar t "$bundle/$file" | grep '^data\.tar') || { echo "$file: no data.tar member"; return 1; }
        case "$member" in
          *.xz) ar p "$bundle/$file" "$member" | xz -dc | tar -x -C "$prefix" || return 1 ;;
          *.zst) ar p "$bundle/$file" "$member" | zstd -dc | tar -x -C "$prefix" || return 1 ;;
          *) ar p "$bundle/$file" "$member" | tar -x -C "$prefix" || return 1 ;;
        esac ;;
      python) python3 "$root/tests/gpu/deb_extract.py" "$bundle/$file" "$prefix" || return 1 ;;
      *) echo "DEB_EXTRACT=$method: use dpkg, ar or python"; return 1 ;;
    esac
  done < "$bundle/MANIFEST"
  # Documentation, and links into packages that did not travel (libopenblas.so -> the runtime
  # package): never a candidate for CMake's searches.
  rm -rf "$prefix/usr/share/doc" "$prefix/usr/share/doc-base"
  find "$prefix" -xtype l -print -delete | sed 's/^/removed dangling link: /'
  du -sh "$prefix"
}

configure() {
  local generator=()
  if command -v ninja > /dev/null; then generator=(-G Ninja); fi
  # shellcheck disable=SC2086  # EXTRA_CMAKE_ARGS is a list of arguments
  cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DATTNRES_GPU_CHECK_ONLY=ON \
    -DATTNRES_CUDA=ON -DCMAKE_PREFIX_PATH="$prefix/usr" ${EXTRA_CMAKE_ARGS:-}
}

run_checks() {
  local left=$(( budget - $(elapsed) - reserve ))
  if [ "$left" -lt 30 ]; then
    echo "device-run: only ${left} s of the ${budget} s budget left for the checks"
    return 124
  fi
  echo "device-run: ${left} s for the checks: ${check_args[*]:-(all)}"
  if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=timestamp,utilization.gpu,utilization.memory,memory.used,power.draw,temperature.gpu,clocks.sm \
      --format=csv -l 1 > "$out/nvidia-smi-trace.csv" 2>&1 &
    monitor_pid=$!
  fi
  local rc
  if [ "${DEVICE_RUN_EMULATE:-0}" = 1 ]; then
    timeout --signal=TERM --kill-after=15 "$left" bash "$root/tests/gpu/emu/run.sh" "$build" "${check_args[@]}"
    rc=$?
  else
    # check.sh finds the configured build (its cmake --build is then a no-op) and bounds the
    # checks by BUDGET; the outer timeout bounds the rest.
    BUILD_DIR="$build" JOBS="$jobs" BUDGET=$((left - 10)) \
      timeout --signal=TERM --kill-after=15 "$left" bash "$root/tests/gpu/check.sh" "${check_args[@]}"
    rc=$?
  fi
  if [ -n "$monitor_pid" ]; then kill "$monitor_pid" 2> /dev/null; wait "$monitor_pid" 2> /dev/null; monitor_pid=""; fi
  return "$rc"
}

if ! command -v nvcc > /dev/null; then
  for d in "${CUDA_HOME:-}" /usr/local/cuda; do
    if [ -n "$d" ] && [ -x "$d/bin/nvcc" ]; then export PATH="$d/bin:$PATH"; break; fi
  done
fi
export NVIDIA_TF32_OVERRIDE=0

mkdir -p "$scratch"
phase env write_env
mv "$out/env.log" "$out/env.txt"
if command -v nvidia-smi > /dev/null; then nvidia-smi > "$out/nvidia-smi.txt" 2>&1; else echo "nvidia-smi: not found" > "$out/nvidia-smi.txt"; fi
phase unpack unpack || exit "$failed_rc"
phase configure configure || exit "$failed_rc"
phase build cmake --build "$build" --target attnres_gpu_check -j "$jobs" || exit "$failed_rc"
phase checks run_checks
exit "$failed_rc"
