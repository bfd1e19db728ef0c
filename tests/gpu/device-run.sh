#!/usr/bin/env bash
# The one call on a bare GPU machine (docs/cuda.md "Running on a bare GPU machine"): nvcc, CMake,
# ninja, a C++ compiler and PyTorch are there, none of the Debian packages attnres builds against,
# and no network. Unpacks the bundle of scripts/gpu-bundle.sh (.gpu/bundle, carried with the tree)
# into a scratch prefix, builds the whole CLI (`attnres`, -DATTNRES_BUNDLED_DEPS=ON) and the GPU
# check against that prefix only, then runs the phases in order, each under its own time limit, so
# that a failing or slow phase still leaves the others' results:
#
#   build    configure + ninja attnres attnres_gpu_check (-j all cores)
#   checks   tests/gpu/check.sh, by default (a)-(c) (--only abc; CHECK_ARGS overrides)
#   bench    attnres bench --device cuda, presets S and M (--no-m: S only), arms block and rd, bf16
#   peer     scripts/torch_peer.py: the Python package's model on the same GPU, bf16 autocast,
#            torch.compile, SDPA, same batch, shapes, AdamW and step; MFU against bench's GEMM rate
#   study    prepare the carried corpus slice (.gpu/data, scripts/gpu-data-slice.sh), experiment
#            --device cuda (2 arms x 2 seeds of preset small), report
#   resume   train --device cuda, SIGINT mid-way, --resume; compared with an uninterrupted run
#            (scripts/compare_runs.py)
#   eval     eval --device cuda vs CPU eval of the same checkpoint; greedy sample --device cuda vs
#            the CPU's; a CPU run continued on the GPU and a GPU run continued on the CPU
#   checks_d_cudnn  check (d) with the cuDNN attention (every family's arm at S), (r), (e); then
#            (d) for block and rd with the WMMA attention
#   ncu      an ncu profile of one S step (tests/gpu/profile.sh)
# (in the order of all_phases below: peer runs after checks_d_cudnn)
#
#   tests/gpu/device-run.sh OUT_DIR [BUDGET_S] [--phases LIST] [--archive FILE] [--no-m] [-- CHECK_ARGS...]
#
# BUDGET_S (default 540) bounds the whole run; each phase runs under min(its own limit, what is
# left less 15 s). --phases (default: all above, in that order) selects phases by name, comma-
# separated; `build` is implied when the binaries are missing. --archive FILE packs OUT_DIR into
# one .tgz at the end (the device tool brings back at most 8 files), whatever happens.
# OUT_DIR receives:
#   summary.txt        result per phase, timings, the check table and each phase's headline
#   timings.tsv        wall and CPU seconds, limit and exit status per phase
#   env.txt, nvidia-smi.txt, nvidia-smi-trace.csv (utilisation, memory, power each second)
#   PHASE.log          each phase's output; PHASE/ its files (bench JSON, peer JSON, the study's
#                      summary and report, comparisons)
#   cmake-cache.txt, ninja-log.txt, ldd.txt, table.txt (the checks' table)
# Exit status: 0 when every phase run passed, else the first failed phase's status (124: past
# its limit).
#
# Environment: GPU_BUNDLE (default .gpu/bundle), GPU_DATA (default .gpu/data), GPU_SCRATCH (default
# a new /tmp/attnres-gpu.*: prefix/, build/, runs/), EXTRA_CMAKE_ARGS, DEB_EXTRACT=dpkg|ar|python,
# PYTHON (default python3), and for rehearsals without a GPU (tests/gpu/rehearse.sh):
# DEVICE_RUN_DEVICE=cpu (the CLI phases on the CPU; default cuda), DEVICE_RUN_SIZE=tiny (tiny
# presets and step counts; default gpu), DEVICE_RUN_EMULATE=1 (checks under the CPU emulator),
# DEVICE_RUN_PEER_ARGS (extra torch_peer.py flags, e.g. --no-compile), DEVICE_RUN_LIMIT_SCALE
# (multiplies every phase's limit; default 1).
set -uo pipefail

usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
if [ $# -lt 1 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then usage; exit 2; fi
root="$(cd "$(dirname "$0")/../.." && pwd)"
mkdir -p "$1" || exit 2
out="$(cd "$1" && pwd)"
shift
budget=540
if [ $# -ge 1 ] && [[ "$1" =~ ^[0-9]+$ ]]; then budget="$1"; shift; fi

# The quick phases that each answer a whole question first, the long ones last, so that a call
# past its budget loses the fewest answers: the build and the correctness checks (#45, #48, #49),
# bench (#45), the CLI on the GPU at preset small (study, resume, eval: #45; about 100 s together),
# then check (d) with cuDNN's attention and every family's arm, (r), (e) (#48, #49; about 150 s),
# the torch.compile peer (#45, #49; its compiles take the longest) and an ncu profile (#49). A phase
# is a function phase_NAME below (it writes into "$out/NAME/" and returns non-zero on failure)
# with a limit in phase_limit.
all_phases=(build checks bench study resume eval checks_d_cudnn peer ncu)
phases_arg=""
archive=""
with_m=1
check_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --phases) phases_arg="${2:-}"; shift 2 ;;
    --phases=*) phases_arg="${1#--phases=}"; shift ;;
    --archive) archive="${2:-}"; shift 2 ;;
    --no-m) with_m=0; check_args+=(--no-m); shift ;;
    --) shift; check_args+=("$@"); break ;;
    *) check_args+=("$1"); shift ;;  # compatibility: options after BUDGET_S go to the check
  esac
done
if [ -n "$phases_arg" ]; then IFS=',' read -r -a phases <<< "$phases_arg"; else phases=("${all_phases[@]}"); fi
for p in "${phases[@]}"; do
  printf '%s\n' "${all_phases[@]}" | grep -qxF "$p" || { echo "device-run: unknown phase '$p' (known: ${all_phases[*]})" >&2; exit 2; }
done
if [ -n "$archive" ]; then case "$archive" in /*) ;; *) archive="$PWD/$archive" ;; esac; fi

bundle="${GPU_BUNDLE:-$root/.gpu/bundle}"
data_slice="${GPU_DATA:-$root/.gpu/data}"
scratch="${GPU_SCRATCH:-$(mktemp -d "${TMPDIR:-/tmp}/attnres-gpu.XXXXXX")}"
prefix="$scratch/prefix"
build="$scratch/build"
runs="$scratch/runs"
attnres="$build/src/cli/attnres"
jobs=$(nproc)
reserve=15
device="${DEVICE_RUN_DEVICE:-cuda}"
size="${DEVICE_RUN_SIZE:-gpu}"
python="${PYTHON:-python3}"
t0=$(date +%s.%N)
elapsed() { awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.0f", b - a}'; }

# Each phase's own limit in seconds (the sum of those run is what a budget should cover; on an
# H100/H200 the default order fits 540 s with the build's ~90 s).
# DEVICE_RUN_LIMIT_SCALE multiplies them (a rehearsal on a slow CPU).
phase_limit() {
  local s
  case "$1" in
    build) s=240 ;; checks) s=60 ;; bench) s=110 ;; peer) s=150 ;;
    study) s=150 ;; resume) s=80 ;; eval) s=90 ;; checks_d_cudnn) s=190 ;; ncu) s=100 ;; *) s=60 ;;
  esac
  echo $(( s * ${DEVICE_RUN_LIMIT_SCALE:-1} ))
}

rm -rf "$out"/*.log "$out"/{summary.txt,table.txt,timings.tsv,status,headlines.txt}
printf 'phase\twall_s\tcpu_s\tlimit_s\texit\n' > "$out/timings.tsv"
: > "$out/headlines.txt"
failed_phase=""
failed_rc=0
monitor_pid=""

# run_phase NAME: runs phase_NAME with its output in NAME.log under its limit; records wall time,
# CPU time (user + system, children included), limit and exit status. Never stops the script.
run_phase() {
  local name="$1" rc times limit left TIMEFORMAT='%R %U %S'
  limit=$(phase_limit "$name")
  left=$(( budget - $(elapsed) - reserve ))
  if [ "$left" -lt "$limit" ]; then limit=$left; fi
  mkdir -p "$out/$name"
  if [ "$limit" -lt 5 ]; then
    echo "device-run: $name: skipped, ${left} s of the ${budget} s budget left" | tee "$out/$name.log"
    printf '%s\t0\t0\t%s\t%s\n' "$name" "$limit" 124 >> "$out/timings.tsv"
    rc=124
  else
    PHASE_LIMIT="$limit"
    { time "phase_$name" > "$out/$name.log" 2>&1; } 2> "$scratch/phase-time"
    rc=$?
    times=$(tail -n 1 "$scratch/phase-time")
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$(echo "$times" | awk '{printf "%.1f", $1}')" \
      "$(echo "$times" | awk '{printf "%.1f", $2 + $3}')" "$limit" "$rc" >> "$out/timings.tsv"
    echo "device-run: $name: exit $rc ($(echo "$times" | awk '{printf "%.1f s, CPU %.1f s", $1, $2 + $3}'), limit ${limit} s; $(elapsed) s in all)"
  fi
  rmdir "$out/$name" 2> /dev/null
  if [ "$rc" -ne 0 ] && [ -z "$failed_phase" ]; then failed_phase="$name"; failed_rc=$rc; fi
  return "$rc"
}

# limited SECONDS COMMAND...: COMMAND under the phase's clock (TERM, then KILL 10 s later).
limited() { local s="$1"; shift; timeout --signal=TERM --kill-after=10 "$s" "$@"; }
# What is left of the current phase's limit, less `margin` seconds.
phase_left() { local margin="${1:-5}"; echo $(( PHASE_LIMIT - SECONDS + phase_start - margin )); }
headline() { echo "$*" | tee -a "$out/headlines.txt"; }

finish() {
  if [ -n "$monitor_pid" ]; then kill "$monitor_pid" 2> /dev/null; wait "$monitor_pid" 2> /dev/null; fi
  if [ -f "$build/CMakeCache.txt" ]; then cp "$build/CMakeCache.txt" "$out/cmake-cache.txt"; fi
  if [ -f "$build/.ninja_log" ]; then cp "$build/.ninja_log" "$out/ninja-log.txt"; fi
  { for b in "$build/tests/gpu/attnres_gpu_check" "$attnres"; do
      if [ -x "$b" ]; then echo "== $b"; ldd "$b" 2>&1; fi
    done; } > "$out/ldd.txt"
  if [ -f "$out/checks.log" ]; then
    sed -n '/^device 0:\|^attnres_gpu_check: no CUDA device/,/^summary:/p' "$out/checks.log" > "$out/table.txt"
  fi
  {
    if [ -z "$failed_phase" ]; then echo "result: ok"; else echo "result: failed in $failed_phase (exit $failed_rc)"; fi
    echo "phases: ${phases[*]}; device: $device; size: $size; budget: $budget s; total: $(elapsed) s"
    echo "bundle: $bundle; scratch: $scratch; jobs: $jobs"
    echo
    column -t -s $'\t' "$out/timings.tsv" 2> /dev/null || cat "$out/timings.tsv"
    if [ -s "$out/headlines.txt" ]; then echo; cat "$out/headlines.txt"; fi
    if [ -s "$out/table.txt" ]; then echo; cat "$out/table.txt"; fi
  } > "$out/summary.txt"
  if [ -n "$failed_phase" ] && [ "$failed_phase" != checks ] && [ -f "$out/$failed_phase.log" ]; then
    echo "device-run: the last lines of $failed_phase.log:"
    tail -n 40 "$out/$failed_phase.log"
  fi
  echo "---- $out/summary.txt"
  cat "$out/summary.txt"
  if [ -n "$archive" ]; then
    mkdir -p "$(dirname "$archive")"
    tar czf "$archive" -C "$(dirname "$out")" "$(basename "$out")" && echo "device-run: archive $archive ($(du -h "$archive" | cut -f1))"
  fi
}
trap finish EXIT

write_env() {
  echo "date: $(date -u +%FT%TZ)"
  echo "host: $(uname -a)"
  if [ -f /etc/os-release ]; then grep -E '^(PRETTY_NAME|VERSION_ID)=' /etc/os-release; fi
  echo "glibc: $(ldd --version 2>&1 | head -n 1)"
  echo "cores: $jobs; memory: $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
  for tool in c++ g++ gcc cmake ninja nvcc "$python"; do
    if command -v "$tool" > /dev/null; then echo "$tool: $(command -v "$tool"): $("$tool" --version 2>&1 | grep -m1 -E '[0-9]+\.[0-9]+')"
    else echo "$tool: not found"; fi
  done
  "$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>&1 | tail -n 1
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
      python) "$python" "$root/tests/gpu/deb_extract.py" "$bundle/$file" "$prefix" || return 1 ;;
      *) echo "DEB_EXTRACT=$method: use dpkg, ar or python"; return 1 ;;
    esac
  done < "$bundle/MANIFEST"
  # Documentation, and links into packages that did not travel (libopenblas.so -> the runtime
  # package, libz.so -> zlib1g): never a candidate for CMake's searches.
  rm -rf "$prefix/usr/share/doc" "$prefix/usr/share/doc-base" "$prefix/usr/share/man"
  find "$prefix" -xtype l -print -delete | sed 's/^/removed dangling link: /'
  du -sh "$prefix"
}

# ---- the phases: phase_NAME, run by run_phase NAME, output in NAME.log, files in $out/NAME/ ----

phase_build() {
  local generator=()
  if command -v ninja > /dev/null; then generator=(-G Ninja); fi
  if [ ! -f "$prefix/.unpacked" ]; then unpack || return 1; touch "$prefix/.unpacked"; fi
  echo "---- configure"
  # shellcheck disable=SC2086  # EXTRA_CMAKE_ARGS is a list of arguments
  limited "$(phase_left)" cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DATTNRES_BUNDLED_DEPS=ON -DATTNRES_CUDA=ON -DATTNRES_BUILD_TESTS=OFF -DATTNRES_BUILD_BENCH=OFF \
    -DATTNRES_MPI=OFF -DCMAKE_PREFIX_PATH="$prefix/usr" ${EXTRA_CMAKE_ARGS:-} || return 1
  echo "---- build"
  limited "$(phase_left 2)" cmake --build "$build" --target attnres attnres_gpu_check -j "$jobs" || return 1
  "$attnres" --version
}

phase_checks() {
  cudnn_env || true
  local args=("${check_args[@]}")
  if [ ${#args[@]} -eq 0 ] || ! printf '%s\n' "${args[@]}" | grep -q -- '^--only'; then args=(--only abc "${args[@]}"); fi
  local left
  left=$(phase_left 3)
  echo "device-run: ${left} s for the checks: ${args[*]}"
  if [ "${DEVICE_RUN_EMULATE:-0}" = 1 ]; then
    limited "$left" bash "$root/tests/gpu/emu/run.sh" "$build" "${args[@]}"
  else
    # check.sh finds the configured build (its cmake --build is then a no-op) and bounds the checks.
    BUILD_DIR="$build" JOBS="$jobs" BUDGET=$((left - 5)) limited "$left" bash "$root/tests/gpu/check.sh" "${args[@]}"
  fi
}

# Sizes: the GPU's, or tiny ones for a rehearsal on the CPU.
if [ "$size" = tiny ]; then
  bench_presets=(tiny); bench_flags=(--steps 2 --warmup 1 --vocab 512 --set model.n_layers=2)
  study_preset=tiny; study_tokens=16384; resume_tokens=24576; resume_steps=24; resume_stop_step=8
  prepare_flags=(--vocab-size 512 --max-sentences 20000)
else
  bench_presets=(S); if [ "$with_m" = 1 ]; then bench_presets+=(M); fi
  bench_flags=(--steps 10 --warmup 2)
  study_preset=small; study_tokens=2097152; resume_tokens=1048576; resume_steps=256; resume_stop_step=0
  prepare_flags=(--vocab-size 4096)
fi

phase_bench() {
  local preset rc=0
  for preset in "${bench_presets[@]}"; do
    echo "---- bench preset $preset"
    limited "$(phase_left)" "$attnres" bench --preset "$preset" --device "$device" --precision bf16 --arms block,rd \
      --torch off "${bench_flags[@]}" --json-file "$out/bench/bench-$preset.json" || rc=1
    if [ -f "$out/bench/bench-$preset.json" ]; then
      "$python" - "$out/bench/bench-$preset.json" "$preset" <<'EOF' | tee -a "$out/headlines.txt"
import json, sys
r = json.load(open(sys.argv[1]))
rate = r["mfu_reference"].get("bf16", r["mfu_reference"]["fp32"])  # the chosen rate, its candidates beside it
for c in r["runs"]:
    print(f"bench {sys.argv[2]} {c['arm']}: {c['tokens_per_sec']:.0f} tokens/s, MFU {100 * c['mfu']:.1f}% "
          f"(vs {rate.get('op', '?')} {rate.get('gflops', 0) / 1e3:.1f} TFLOP/s), step {c['step_ms_median']:.1f} ms")
EOF
    fi
  done
  return "$rc"
}

phase_peer() {
  local preset rc=0 bench_json
  for preset in "${bench_presets[@]}"; do
    bench_json="$out/bench/bench-$preset.json"
    if [ ! -f "$bench_json" ]; then echo "no $bench_json (the bench phase did not run or failed)"; rc=1; continue; fi
    echo "---- torch peer of bench preset $preset"
    # shellcheck disable=SC2086  # DEVICE_RUN_PEER_ARGS is a list of flags
    limited "$(phase_left)" "$python" "$root/scripts/torch_peer.py" --bench-json "$bench_json" --device "$device" \
      --json-file "$out/peer/peer-$preset.json" ${DEVICE_RUN_PEER_ARGS:-} || rc=1
    if [ -f "$out/peer/peer-$preset.json" ]; then
      "$python" - "$out/peer/peer-$preset.json" "$preset" <<'EOF' | tee -a "$out/headlines.txt"
import json, sys
for c in json.load(open(sys.argv[1]))["runs"]:
    print(f"peer {sys.argv[2]} {c['arm']}: {c['tokens_per_sec']:.0f} tokens/s, MFU {100 * c['mfu']:.1f}%, "
          f"compile {c['compile_s']:.1f} s, peak {c['peak_memory_bytes'] / 2**30:.2f} GiB ({c['attention']}, "
          f"compile={c['compiled']}); attnres/torch {c.get('attnres_over_torch', float('nan')):.2f}")
EOF
    fi
  done
  return "$rc"
}

phase_study() {
  local corpus="$data_slice/corpus"
  test -d "$corpus" || { echo "no $corpus: run scripts/gpu-data-slice.sh and carry .gpu/data"; return 1; }
  rm -rf "$runs/data" "$runs/study"
  echo "---- prepare"
  limited "$(phase_left)" "$attnres" prepare --input "$corpus" --out "$runs/data" "${prepare_flags[@]}" --quiet || return 1
  echo "---- experiment"
  limited "$(phase_left 15)" "$attnres" experiment --preset "$study_preset" --arms block,rd --seeds 1,2 \
    --data "$runs/data" --out "$runs/study" --device "$device" --tokens "$study_tokens" \
    --set train.precision=bf16 || return 1
  echo "---- report"
  limited "$(phase_left)" "$attnres" report --experiment "$runs/study" --out "$out/study" || return 1
  cp "$runs/study/experiment.json" "$out/study/" 2> /dev/null
  headline "study: $(grep -m1 '^- rd vs block' "$out/study/report.md" 2> /dev/null | cut -c3-200 || echo 'report written')"
}

# The prepared data of the study, or a fresh one when the study did not run.
ensure_data() {
  if [ -f "$runs/data/manifest.json" ]; then return 0; fi
  limited "$(phase_left)" "$attnres" prepare --input "$data_slice/corpus" --out "$runs/data" "${prepare_flags[@]}" --quiet
}

# train_run SECONDS RUN_DIR DEVICE [flags]: a run of the study's preset, rd, bf16, a checkpoint every
# 4 steps, under a time limit (SECONDS 0: none, for a run started in the background).
train_run() {
  local limit="$1" dir="$2" dev="$3"
  shift 3
  local cmd=("$attnres" train --preset "$study_preset" --set model.residual=rd --set train.precision=bf16
             --set train.checkpoint_every=4 --data "$runs/data" --out "$dir" --device "$dev" --tokens "$resume_tokens" "$@")
  if [ "$limit" = 0 ]; then "${cmd[@]}"; else limited "$limit" "${cmd[@]}"; fi
}

phase_resume() {
  ensure_data || return 1
  rm -rf "$runs/resume-whole" "$runs/resume-cut"
  echo "---- uninterrupted"
  train_run "$(phase_left)" "$runs/resume-whole" "$device" || return 1
  local steps
  steps=$(wc -l < "$runs/resume-whole/metrics.jsonl")
  echo "---- interrupted (the uninterrupted run's metrics.jsonl has $steps lines)"
  if [ "$resume_stop_step" -gt 0 ]; then
    # Rehearsal: a SIGINT at a chosen step cannot be timed on a loaded CPU; --stop-at-step takes
    # the same save-and-exit path.
    train_run "$(phase_left)" "$runs/resume-cut" "$device" --stop-at-step "$resume_stop_step"
    echo "exit $? (--stop-at-step $resume_stop_step)"
  else
    # attnres installs its own SIGINT handler, so the signal reaches it although a background
    # job of a script starts with SIGINT ignored.
    "$attnres" train --preset "$study_preset" --set model.residual=rd --set train.precision=bf16 \
      --set train.checkpoint_every=4 --data "$runs/data" --out "$runs/resume-cut" --device "$device" \
      --tokens "$resume_tokens" &
    local pid=$! deadline=$(( SECONDS + $(phase_left 30) ))
    # SIGINT once the run has logged about a third of the uninterrupted run's lines.
    while kill -0 "$pid" 2> /dev/null && [ "$SECONDS" -lt "$deadline" ] &&
          [ "$(cat "$runs/resume-cut/metrics.jsonl" 2> /dev/null | wc -l)" -lt $((steps / 3 + 1)) ]; do
      sleep 0.2
    done
    kill -INT "$pid" 2> /dev/null
    wait "$pid"
    echo "exit $? after SIGINT (130: stopped with the work saved)"
  fi
  ls "$runs/resume-cut"
  echo "---- --resume"
  train_run "$(phase_left)" "$runs/resume-cut" "$device" --resume || return 1
  "$python" "$root/scripts/compare_runs.py" "$runs/resume-whole" "$runs/resume-cut" --json "$out/resume/compare.json" |
    tee "$out/resume/compare.txt"
  local rc=${PIPESTATUS[0]}
  headline "resume: $(tail -n 1 "$out/resume/compare.txt")"
  return "$rc"
}

phase_eval() {
  ensure_data || return 1
  local ckpt="$runs/resume-whole" rc=0
  if [ ! -f "$ckpt/model.safetensors" ]; then
    rm -rf "$ckpt"
    train_run "$(phase_left)" "$ckpt" "$device" || return 1
  fi
  echo "---- eval on $device and on the CPU"
  limited "$(phase_left)" "$attnres" eval --checkpoint "$ckpt" --data "$runs/data" --split val --device "$device" \
    --json > "$out/eval/eval-$device.json" || rc=1
  limited "$(phase_left)" "$attnres" eval --checkpoint "$ckpt" --data "$runs/data" --split val --device cpu \
    --json > "$out/eval/eval-cpu.json" || rc=1
  "$python" - "$out/eval/eval-$device.json" "$out/eval/eval-cpu.json" <<'EOF' | tee -a "$out/headlines.txt" || rc=1
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
na, nb = a["nll"], b["nll"]
# bf16 vs fp32: the check's bound on a loss ((b): 1e-2 absolute) for a bf16 model scored in fp32
ok = abs(na - nb) <= 1e-2
print(f"eval: NLL {na:.5f} (device) vs {nb:.5f} (cpu): |diff| {abs(na - nb):.2e} {'within' if ok else 'OUTSIDE'} 1e-2")
sys.exit(0 if ok else 1)
EOF
  echo "---- sample, greedy, on $device (a full pass per token) and on the CPU (KV cache)"
  limited "$(phase_left)" "$attnres" sample --checkpoint "$ckpt" --prompt "The" --max-tokens 24 --temperature 0 \
    --device "$device" > "$out/eval/sample-$device.txt" || rc=1
  limited "$(phase_left)" "$attnres" sample --checkpoint "$ckpt" --prompt "The" --max-tokens 24 --temperature 0 \
    --device cpu > "$out/eval/sample-cpu.txt" || rc=1
  if cmp -s "$out/eval/sample-$device.txt" "$out/eval/sample-cpu.txt"; then
    headline "eval: sample --temperature 0: the same 24 tokens on $device and the CPU"
  else  # fp32 on both; a near-tie between two logits may still pick another token
    headline "eval: sample --temperature 0 differs between $device and the CPU (see eval/sample-*.txt)"
  fi
  echo "---- a run continued on the other device (stopped at a checkpoint on one, resumed on the other)"
  local other=cpu  # for a rehearsal on the CPU (DEVICE_RUN_DEVICE=cpu) both sides are the CPU
  rm -rf "$runs/cross-a" "$runs/cross-b"
  # The CPU's share short either way (4 steps first, or the last 8), so the phase stays short.
  local back=$((resume_steps - 8))
  train_run "$(phase_left)" "$runs/cross-a" "$other" --stop-at-step 4; echo "exit $? (stopped on $other at step 4)"
  train_run "$(phase_left)" "$runs/cross-a" "$device" --resume || rc=1
  train_run "$(phase_left)" "$runs/cross-b" "$device" --stop-at-step "$back"; echo "exit $? (stopped on $device at step $back)"
  train_run "$(phase_left)" "$runs/cross-b" "$other" --resume || rc=1
  local name
  for name in cross-a cross-b; do
    "$python" "$root/scripts/compare_runs.py" "$runs/$name" "$runs/resume-whole" --tolerance 0.02 \
      --json "$out/eval/$name.json" > "$out/eval/$name.txt" || rc=1
    cat "$out/eval/$name.txt"
    headline "eval: $name ($([ $name = cross-a ] && echo "$other then $device" || echo "$device then $other")) vs $device alone: $(tail -n 1 "$out/eval/$name.txt")"
  done
  return "$rc"
}
# Issue #49: cuDNN's attention. The linked cuDNN's directory on LD_LIBRARY_PATH (it dlopens its
# sub-libraries); false when the build has none.
cudnn_env() {
  local lib dir
  grep -q '^ATTNRES_CUDNN:BOOL=OFF' "$build/CMakeCache.txt" 2> /dev/null && return 1
  lib=$(sed -n 's/^ATTNRES_CUDNN_LIBRARY:FILEPATH=//p' "$build/CMakeCache.txt" 2> /dev/null)
  [ -f "$lib" ] || return 1
  dir=$(dirname "$lib")
  export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}
# Check (d) (step time, MFU, RD/Block) for S (and M) with --attention cudnn, then wmma, in one call.
phase_checks_d_cudnn() {
  mkdir -p "$out/checks_d_cudnn"
  cudnn_env || echo "device-run: this build has no cuDNN (see build.log's 'CUDA backend: cuDNN' line)"
  local impl rc=0 m=()
  [ "$with_m" = 1 ] || m=(--no-m)
  for impl in cudnn wmma; do
    echo "---- check (d), --attention $impl"
    # cuDNN: (d) for S and M with every baseline family's arm (#48) at S, (r) and (e) (#49: the
    # depth-read backward's bandwidth, RoPE / SwiGLU / cross-entropy before and after). WMMA: the
    # attention kernels' comparison only, (d) for block and rd at S (the budget: about 25 s of 190).
    local args=(--only dre "${m[@]}")
    [ "$impl" = wmma ] && args=(--only d --no-m --modes block,rd)
    limited "$(phase_left 3)" "$build/tests/gpu/attnres_gpu_check" --attention "$impl" "${args[@]}" \
      > "$out/checks_d_cudnn/$impl.txt" 2>&1 || rc=1
    cat "$out/checks_d_cudnn/$impl.txt"
    headline "checks_d_cudnn --attention $impl: $(grep -E '^  d  (S|M) [a-z0-9+-]+ +[0-9]' "$out/checks_d_cudnn/$impl.txt" |
      sed -E 's/^  d  ([SM] [a-z0-9+-]+) +([0-9]+ tokens\/s), step ([0-9.]+ ms), (MFU [0-9.]+%).*/\1: \2, \3, \4/' | paste -sd ';' -)"
    headline "checks_d_cudnn (e) --attention $impl: $(grep -E '^  e  [SM] (bf16 |cross-entropy)' "$out/checks_d_cudnn/$impl.txt" |
      sed -E 's/^  e  (.*[^ ]) +old ([0-9.]+) ms, [^(]*\(([0-9]+)% of copy\); new ([0-9.]+) ms, [^(]*\(([0-9]+)% of copy\).*/\1 \2 -> \4 ms (\3% -> \5% of copy)/' |
      paste -sd ';' -)"
  done
  return "$rc"
}
# One ncu profile of an S step with the cuDNN attention (tests/gpu/profile.sh, kernel_times.py).
phase_ncu() {
  cudnn_env || echo "device-run: this build has no cuDNN: the profile is of the WMMA kernels"
  local left
  left=$(phase_left 10)
  PROFILE_CHECK_ARGS="--attention ${NCU_ATTENTION:-cudnn}" limited "$(phase_left 3)" \
    bash "$root/tests/gpu/profile.sh" "$build" "$out/ncu" "$left" 0 0
  local rc=$?
  if [ -f "$out/ncu/kernel-times.txt" ]; then
    headline "ncu (S, --attention ${NCU_ATTENTION:-cudnn}): $(grep -E '^(block|rd):|^  (attention|depth read|GEMM)' "$out/ncu/kernel-times.txt" | tr -s ' ' | paste -sd ';' -)"
  fi
  return "$rc"
}

if ! command -v nvcc > /dev/null; then
  for d in "${CUDA_HOME:-}" /usr/local/cuda; do
    if [ -n "$d" ] && [ -x "$d/bin/nvcc" ]; then export PATH="$d/bin:$PATH"; break; fi
  done
fi
export NVIDIA_TF32_OVERRIDE=0
export PYTHONUNBUFFERED=1

mkdir -p "$scratch" "$runs"
write_env > "$out/env.txt" 2>&1
if command -v nvidia-smi > /dev/null; then
  nvidia-smi > "$out/nvidia-smi.txt" 2>&1
  nvidia-smi --query-gpu=timestamp,utilization.gpu,utilization.memory,memory.used,power.draw,temperature.gpu,clocks.sm \
    --format=csv -l 1 > "$out/nvidia-smi-trace.csv" 2>&1 &
  monitor_pid=$!
else
  echo "nvidia-smi: not found" > "$out/nvidia-smi.txt"
fi

# Without `build`, the binaries the phases need must be there already; else build first.
missing=""
for p in "${phases[@]}"; do
  case "$p" in
    build) missing=""; break ;;
    checks) [ -x "$build/tests/gpu/attnres_gpu_check" ] || missing="attnres_gpu_check" ;;
    bench | study | resume | eval) [ -x "$attnres" ] || missing="attnres" ;;
  esac
done
if [ -n "$missing" ]; then
  echo "device-run: no $missing in $build: building first"
  phases=(build "${phases[@]}")
fi
for p in "${phases[@]}"; do
  phase_start=$SECONDS
  run_phase "$p"
  rc=$?
  if [ "$p" = build ] && [ "$rc" -ne 0 ]; then echo "device-run: the build failed: no further phase"; break; fi
done
exit "$failed_rc"
