#!/usr/bin/env bash
# Rehearses tests/gpu/device-run.sh on this machine (no GPU) the way the bare GPU machine runs it
# (docs/cuda.md "Running on a bare GPU machine"), so that GPU minutes go to the checks:
#
#   1. scripts/gpu-bundle.sh (.gpu/bundle) and scripts/gpu-data-slice.sh (.gpu/data);
#   2. a copy of what the GPU machine receives (tracked and untracked-not-ignored files, plus the
#      carried .gpu/bundle and .gpu/data) in a scratch directory;
#   3. a private mount namespace (unshare -m) whose /usr is an overlay hiding every file of the
#      Debian packages a bare machine lacks (OpenBLAS, SentencePiece, CLI11, toml++, nlohmann-json,
#      zlib headers, Boost, Open MPI, GoogleTest, Google Benchmark, libgfortran, pkg-config); without
#      unshare or overlayfs it warns and relies on step 5 alone;
#   4. in there, tests/gpu/device-run.sh from the copy, phases build and checks: the whole CLI and
#      the GPU check built from the bundle (unpacking with `ar`, what a machine without dpkg does),
#      a clean build directory, no ccache unless CCACHE=1; then (4b, after the namespace: Debian's
#      torch needs the BLAS it hides) the CLI phases (bench, peer, study, resume, eval) with
#      DEVICE_RUN_DEVICE=cpu at tiny sizes (DEVICE_RUN_SIZE=tiny; torch_peer.py with --no-compile on
#      Debian's torch): the script's logic, the CLI commands and the comparison scripts, with the
#      CPU standing in for the GPU;
#   5. verification: the check binary started and stopped with "no CUDA device" (exit 2, the
#      point where a GPU is needed); `attnres --version` ran; the CLI phases passed; the CMake
#      cache found every dependency in the prefix and never looked for MPI, GoogleTest, Google
#      Benchmark or pkg-config; no compiled header and no loaded library is a file of a hidden
#      package; ldd resolves everything (SentencePiece from the prefix); the prefix's headers were
#      the ones compiled;
#   6. the timings, with an estimate for the GPU machine's 16 cores.
#
#   tests/gpu/rehearse.sh [OUT_DIR]     (default build-gpu-rehearsal; make gpu-rehearsal)
#   EMULATE="--only c --steps 2"        then also the checks under the CPU emulator (tests/gpu/emu),
#                                       same build, DEVICE_RUN_EMULATE=1: a table that must pass
#   CLI_PHASES=0                        skip step 4b
#   CCACHE=1                            compile through ccache (CCACHE_BASEDIR: the scratch
#                                       directory), so that a second rehearsal is quick
#   KEEP=1                              keep the scratch directory (/tmp/attnres-rehearsal.*)
# Takes several minutes (the full CUDA build on this machine's cores); not part of `make test`.
set -euo pipefail

# The Debian packages a bare GPU machine lacks (the issue's list, their runtime libraries and the
# tools that would find them).
hidden_packages() {
  dpkg-query -W -f='${binary:Package}\n' | grep -E '^(libopenblas|libblas|liblapack|libsentencepiece|libcli11|libtomlplusplus|nlohmann-json|zlib1g-dev|libboost|libopenmpi|openmpi|libgtest|libgmock|googletest|libbenchmark|libgfortran|pkg-config|pkgconf|libpkgconf)' || true
}

verify() {
  local scratch="$1" out="$2" build="$1/gpu/build" prefix="$1/gpu/prefix" tree="$1/tree" fail=0 report="$2/rehearsal.txt"
  local dev="$out/device"
  set +e  # every check reports; the result is $fail
  note() { echo "$*" | tee -a "$report"; }
  bad() { note "FAIL: $*"; fail=1; }
  : > "$report"
  note "rehearse: 5. verification"
  local rc
  rc=$(cat "$scratch/device-rc")
  if [ "$rc" = 2 ] && grep -q '^attnres_gpu_check: no CUDA device' "$dev/checks.log"; then
    note "ok: attnres_gpu_check started and stopped at 'no CUDA device' (exit 2)"
  else
    bad "device-run.sh exit $rc; expected 2 with 'no CUDA device' in checks.log"
  fi
  # The three ways device-run.sh unpacks a .deb give the same tree (names, types, modes, link
  # targets, sizes).
  local m listing first=""
  for m in dpkg ar python; do
    rm -rf "$scratch/x-$m" && mkdir -p "$scratch/x-$m"
    while read -r _ _ _ _ file; do
      case $m in
        dpkg) dpkg-deb -x "$tree/.gpu/bundle/$file" "$scratch/x-$m" ;;
        ar) ar p "$tree/.gpu/bundle/$file" data.tar.xz | xz -dc | tar -x -C "$scratch/x-$m" ;;
        python) python3 "$tree/tests/gpu/deb_extract.py" "$tree/.gpu/bundle/$file" "$scratch/x-$m" ;;
      esac
    done < "$tree/.gpu/bundle/MANIFEST"
    listing=$(cd "$scratch/x-$m" && find . -printf '%p %y %m %l %s\n' | sort | sha256sum | cut -c1-16)
    if [ -z "$first" ]; then first=$listing; elif [ "$listing" != "$first" ]; then bad "unpacking with $m gives another tree"; fi
  done
  [ "$fail" = 1 ] || note "ok: dpkg-deb, ar + tar and deb_extract.py unpack the bundle identically"
  # Every dependency found in the prefix; the others never looked for.
  local key value
  for key in OPENBLAS_OPENMP_LIB OPENBLAS_OPENMP_INCLUDE TOMLPP_INCLUDE_DIR nlohmann_json_DIR \
             SENTENCEPIECE_BUNDLED_INCLUDE SENTENCEPIECE_BUNDLED_LIB SENTENCEPIECE_BUNDLED_TRAIN_LIB ZLIB_INCLUDE_DIR \
             ZLIB_LIBRARY_RELEASE CLI11_DIR Boost_DIR XXHASH_INCLUDE_DIR; do
    value=$(sed -n "s/^$key:[A-Z]*=//p" "$build/CMakeCache.txt")
    case "$value" in "$prefix"/*) note "ok: $key=$value" ;; *) bad "$key=$value is not in the prefix $prefix" ;; esac
  done
  local looked
  looked=$(grep -E '^(MPI_|MPIEXEC|GTest|GTEST|PKG_CONFIG|benchmark)[A-Za-z_]*:' "$build/CMakeCache.txt" || true)
  if [ -z "$looked" ]; then note "ok: no MPI, GoogleTest, benchmark or pkg-config entry in the cache"
  else bad "the bundled configure looked for: $(echo "$looked" | cut -d: -f1 | tr '\n' ' ')"; fi
  # Headers: the compiler's dependency lists (ninja -t deps), made absolute.
  if [ ! -f "$build/build.ninja" ]; then bad "the header check reads ninja's dependency lists: install ninja-build"; fi
  (cd "$build" && ninja -t deps) | sed -n 's/^    //p' | (cd "$build" && xargs -r realpath -m --) | sort -u > "$scratch/headers.txt"
  local leaked
  leaked=$(comm -12 "$scratch/headers.txt" <(sort -u "$scratch/hidden-files.txt" | xargs -r realpath -m -- | sort -u) || true)
  if [ -z "$leaked" ]; then note "ok: $(wc -l < "$scratch/headers.txt") headers compiled, none from a hidden package"
  else bad "headers from hidden packages: $(echo "$leaked" | head -5 | tr '\n' ' ')"; fi
  local h
  for h in nlohmann/json.hpp toml++/toml.h openblas-openmp/cblas.h CLI/CLI.hpp sentencepiece_processor.h zlib.h \
           boost/math/distributions/students_t.hpp xxhash.h; do
    if grep -q "^$prefix/.*$h\$" "$scratch/headers.txt"; then note "ok: $h compiled from the prefix"
    else bad "$h was not compiled from the prefix"; fi
  done
  local outside
  outside=$(grep -v -e "^$tree/" -e "^$prefix/" -e "^$build/" "$scratch/headers.txt" |
            grep -Ev '^/usr/(include|lib/gcc)/|^/usr/local/cuda' | head -5 || true)
  if [ -n "$outside" ]; then note "note: headers from elsewhere: $(echo "$outside" | tr '\n' ' ')"; fi
  # Libraries.
  local bin
  for bin in "$build/tests/gpu/attnres_gpu_check" "$build/src/cli/attnres"; do
    if [ ! -x "$bin" ]; then bad "no $bin"; continue; fi
    ldd "$bin" > "$scratch/ldd.txt" 2>&1
    if grep -q 'not found' "$scratch/ldd.txt"; then bad "$(basename "$bin"): unresolved libraries: $(grep 'not found' "$scratch/ldd.txt" | tr '\n' ' ')"; fi
    leaked=$(awk '$2 == "=>" {print $3}' "$scratch/ldd.txt" | xargs -r realpath -m -- | sort -u |
             comm -12 - <(xargs -r realpath -m -- < "$scratch/hidden-files.txt" | sort -u) || true)
    if [ -n "$leaked" ]; then bad "$(basename "$bin"): libraries from hidden packages: $leaked"; fi
    note "ok: $(basename "$bin") NEEDED $(objdump -p "$bin" | awk '/NEEDED/ {printf "%s ", $2}')"
    note "    RUNPATH $(objdump -p "$bin" | awk '/RUNPATH|RPATH/ {print $2}')"
    if objdump -p "$bin" | grep NEEDED | grep -q openblas; then bad "$(basename "$bin"): libopenblas is linked dynamically"; fi
    if objdump -p "$bin" | grep NEEDED | grep -q 'libz\.'; then bad "$(basename "$bin"): zlib is linked dynamically"; fi
  done
  if grep -q "libsentencepiece.so.0 => $prefix/" "$scratch/ldd.txt"; then note "ok: attnres loads libsentencepiece from the prefix"
  else bad "attnres does not load libsentencepiece from the prefix: $(grep sentencepiece "$scratch/ldd.txt" | tr '\n' ' ')"; fi
  if grep -q '^attnres ' "$dev/build.log"; then note "ok: $(grep '^attnres ' "$dev/build.log" | tail -n 1)"
  else bad "attnres --version did not run (build.log)"; fi
  if [ -f "$scratch/emulated-rc" ]; then
    rc=$(cat "$scratch/emulated-rc")
    if [ "$rc" = 0 ] && grep -q '^summary: .* 0 failed' "$out/emulated/checks.log"; then
      note "ok: under the emulator: $(grep '^summary:' "$out/emulated/checks.log")"
    else
      bad "the emulated checks exit $rc: $(grep '^summary:' "$out/emulated/checks.log" || echo 'no summary')"
    fi
  fi
  # 6. Timings (this machine is shared: CPU seconds are the portable figure).
  note ""
  note "rehearse: 6. timings here ($(nproc) cores, shared), and an estimate for 16 cores"
  column -t -s $'\t' "$dev/timings.tsv" | tee -a "$report"
  awk -F'\t' -v nlog="$dev/ninja-log.txt" '
    $1 == "build" {bw = $2; bc = $3; cc = 0}
    END {
      while ((getline line < nlog) > 0) {
        if (line ~ /^#/) continue
        split(line, f, "\t"); d = (f[2] - f[1]) / 1000; sum += d
        if (d > longest) {longest = d; name = f[4]}
        end[f[4]] = f[2]; dur[f[4]] = d; lend = (f[2] > lend ? f[2] : lend)
        if (name == f[4]) lend_longest = f[2]
      }
      scale = (sum > 0 ? bc / sum : 1)   # CPU seconds per second of an edge (contention)
      for (k in end) if (end[k] > lend_longest) tail += dur[k]
      lc = longest * scale; tc = tail * scale
      est = (bc / 16 > lc ? bc / 16 : lc) + tc
      printf "build: %.0f s CPU in %d s wall; longest step %s: ~%.0f s CPU; after it (archive, link): ~%.0f s CPU\n", bc, bw, name, lc, tc
      printf "estimate at 16 idle cores: build ~%.0f s (max(CPU/16, longest step) + link; configure and unpack on top, ~10 s on the H200)\n", est
    }' "$dev/timings.tsv" | tee -a "$report"
  if [ "$fail" = 0 ]; then note "rehearse: build and bundle verified"; else note "rehearse: the build's verification FAILED"; fi
  return "$fail"
}

if [ "${1:-}" = --verify ]; then
  verify "$2" "$3"
  exit $?
fi

root="$(cd "$(dirname "$0")/../.." && pwd)"
out="$(mkdir -p "${1:-$root/build-gpu-rehearsal}" && cd "${1:-$root/build-gpu-rehearsal}" && pwd)"
scratch="$(mktemp -d "${TMPDIR:-/tmp}/attnres-rehearsal.XXXXXX")"
cleanup() { if [ "${KEEP:-0}" != 1 ]; then rm -rf "$scratch"; else echo "rehearse: kept $scratch"; fi; }
trap cleanup EXIT

echo "rehearse: 1. bundle and data slice"
"$root/scripts/gpu-data-slice.sh"
"$root/scripts/gpu-bundle.sh"

echo "rehearse: 2. the tree the GPU machine receives"
tree="$scratch/tree"
mkdir -p "$tree"
(cd "$root" && git ls-files -z -co --exclude-standard | xargs -0 -r sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' sh |
  tar --null -T - -cf - && tar -cf - .gpu/bundle .gpu/data) | (cd "$tree" && tar -xif -)
echo "rehearse: $(du -sh "$tree" | cut -f1) in $(find "$tree" -type f | wc -l) files"

echo "rehearse: 3. hiding the packages a bare machine lacks"
mapfile -t packages < <(hidden_packages)
dpkg -L "${packages[@]}" 2> /dev/null | sort -u > "$scratch/hidden-files.txt"
echo "rehearse: ${#packages[@]} packages: ${packages[*]}"
upper="$scratch/overlay/upper"
mkdir -p "$upper" "$scratch/overlay/work"
# Whiteouts (character devices 0:0) for the packages' files and links under /usr (and /lib,
# /bin, /sbin, which are links into /usr on a merged-/usr system).
python3 - "$scratch/hidden-files.txt" "$upper" <<'EOF'
import os, stat, sys
listing, upper = sys.argv[1], sys.argv[2]
n = 0
for path in open(listing).read().splitlines():
    for top in ("/lib/", "/lib64/", "/bin/", "/sbin/"):
        if path.startswith(top) and os.path.islink(top.rstrip("/")):
            path = "/usr" + path
    if not path.startswith("/usr/") or (os.path.isdir(path) and not os.path.islink(path)):
        continue
    if not os.path.lexists(path):
        continue
    target = os.path.join(upper, os.path.relpath(path, "/usr"))
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if not os.path.lexists(target):
        os.mknod(target, stat.S_IFCHR | 0o600, os.makedev(0, 0))
        n += 1
print(f"rehearse: {n} files hidden")
EOF

# Steps 4 and 5 run inside the namespace (the script is run again with this variable set).
inner="$scratch/inner.sh"
cat > "$inner" <<'EOF'
set -uo pipefail
scratch="$1" out="$2" upper="$3" emulate="$4"
tree="$scratch/tree"
if [ "$upper" != none ]; then
  mount -t overlay overlay -o "lowerdir=/usr,upperdir=$upper,workdir=$scratch/overlay/work" /usr || exit 90
  test ! -e /usr/include/nlohmann/json.hpp || { echo "rehearse: the overlay does not hide /usr/include/nlohmann"; exit 90; }
fi
echo "rehearse: 4. device-run.sh (pkg-config: $(command -v pkg-config || echo none);" \
     "/usr/include/nlohmann: $(find /usr/include/nlohmann -type f 2> /dev/null | wc -l) files; cblas.h: $(test -e /usr/include/x86_64-linux-gnu/cblas.h && echo found || echo none))"
cd "$tree"
launcher=()
if [ "${CCACHE:-0}" = 1 ]; then
  export CCACHE_BASEDIR="$scratch" CCACHE_NOHASHDIR=1
  launcher=(EXTRA_CMAKE_ARGS="-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache")
fi
env "${launcher[@]}" DEVICE_RUN_LIMIT_SCALE=30 GPU_SCRATCH="$scratch/gpu" DEB_EXTRACT=ar bash tests/gpu/device-run.sh "$out/device" 5400 --phases build,checks
echo "$?" > "$scratch/device-rc"
if [ -n "$emulate" ]; then
  echo "rehearse: 4c. device-run.sh under the CPU emulator: $emulate"
  # shellcheck disable=SC2086  # the check options
  DEVICE_RUN_LIMIT_SCALE=60 GPU_SCRATCH="$scratch/gpu" DEB_EXTRACT=python DEVICE_RUN_EMULATE=1 bash tests/gpu/device-run.sh "$out/emulated" 3000 --phases checks $emulate
  echo "$?" > "$scratch/emulated-rc"
fi
# Step 5 needs the namespace too: ldd resolves as a bare machine would.
bash "$tree/tests/gpu/rehearse.sh" --verify "$scratch" "$out"
EOF


rc=0
if unshare -m --propagation private true 2> /dev/null && grep -qw overlay /proc/filesystems; then
  unshare -m --propagation private env CCACHE="${CCACHE:-0}" bash "$inner" "$scratch" "$out" "$upper" "${EMULATE:-}" || rc=$?
else
  echo "rehearse: WARNING: no private mount namespace or overlayfs here: the system's copies are not hidden;" \
       "the verification still fails on any header or library taken from them"
  env CCACHE="${CCACHE:-0}" bash "$inner" "$scratch" "$out" none "${EMULATE:-}" || rc=$?
fi

# 4b outside the namespace: Debian's torch (the peer's stand-in for the GPU machine's pip torch,
# which brings its own libraries) needs the BLAS the overlay hides. The attnres binary still loads
# SentencePiece from the prefix (its RUNPATH comes first); step 5 checked that inside.
if [ "${CLI_PHASES:-1}" = 1 ]; then
  echo "rehearse: 4b. the CLI phases on the CPU at tiny sizes (bench, peer, study, resume, eval)"
  cli_rc=0
  (cd "$scratch/tree" && DEVICE_RUN_LIMIT_SCALE=10 GPU_SCRATCH="$scratch/gpu" DEVICE_RUN_DEVICE=cpu DEVICE_RUN_SIZE=tiny \
    PYTHON=/usr/bin/python3 DEVICE_RUN_PEER_ARGS="--no-compile --threads 2" bash tests/gpu/device-run.sh "$out/cli" 3000 \
    --phases bench,peer,study,resume,eval --archive "$out/cli.tgz") > "$out/cli.txt" 2>&1 || cli_rc=$?
  grep '^device-run: ' "$out/cli.txt" || true
  if [ "$cli_rc" = 0 ]; then echo "ok: the CLI phases on the CPU (tiny sizes) passed:" | tee -a "$out/rehearsal.txt"
  else echo "FAIL: the CLI phases on the CPU exit $cli_rc: $(sed -n 's/^result: //p' "$out/cli/summary.txt")" | tee -a "$out/rehearsal.txt"; rc=1; fi
  sed 's/^/    /' "$out/cli/headlines.txt" | tee -a "$out/rehearsal.txt"
fi
if [ "$rc" = 0 ]; then echo "rehearse: PASSED (build, bundle and CLI phases; what needs a GPU was not run)" | tee -a "$out/rehearsal.txt"
else echo "rehearse: FAILED" | tee -a "$out/rehearsal.txt"; fi
exit "$rc"
