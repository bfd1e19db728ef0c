#!/usr/bin/env bash
# Collects what the GPU machine's builds need beyond a compiler, CMake and the CUDA toolkit into
# .gpu/bundle/ (ignored by git), for a bare GPU machine that has none of the Debian packages and no
# network (docs/cuda.md "Running on a bare GPU machine"). Two builds use it (tests/gpu/device-run.sh):
#
# the GPU check (cmake -DATTNRES_GPU_CHECK_ONLY=ON):
#   libopenblas-openmp-dev   cblas.h and the static libopenblas.a (linked in: no libopenblas.so,
#                            libgfortran or glibc-version dependency travels; libgomp is the
#                            GPU machine's compiler's own)
#   nlohmann-json3-dev       header-only
#   libtomlplusplus-dev      its headers, used header-only (its shared library is not needed)
#   libxxhash-dev            xxhash.h, used header-only (safetensors digests, src/util/checksum.cpp)
# and the whole CLI (cmake -DATTNRES_BUNDLED_DEPS=ON: no pkg-config, no MPI), also:
#   libsentencepiece-dev     sentencepiece_processor.h, sentencepiece_trainer.h, the .so links
#   libsentencepiece0        libsentencepiece.so.0 and libsentencepiece_train.so.0 (no static
#                            archive in Debian; they need only libstdc++, libm, libgcc_s and libc,
#                            and are found there through the binary's RUNPATH into the prefix)
#   zlib1g-dev               zlib.h and the static libz.a
#   libcli11-dev             CLI11, header-only, with its CMake config
#   libboost1.74-dev         Boost's headers (Boost.Math, header-only) and BoostConfig.cmake
#
# The .deb files of the versions installed here (scripts/install-deps.sh), from apt's cache
# (/var/cache/apt/archives) when it holds them, else as apt-get download fetches them, and MANIFEST
# (package, version, architecture, sha256, file). tests/gpu/device-run.sh unpacks them into a
# scratch prefix there. Idempotent: files already present with the right version are kept. Prints
# the bundle's size, the size of the tree that travels and the carry list; with the mini-study's
# corpus slice (scripts/gpu-data-slice.sh, .gpu/data) when it exists.
#
#   scripts/gpu-bundle.sh            (needs apt-get and the network unless the files are present)
set -euo pipefail

packages=(libopenblas-openmp-dev nlohmann-json3-dev libtomlplusplus-dev libxxhash-dev
          libsentencepiece-dev libsentencepiece0 zlib1g-dev libcli11-dev libboost1.74-dev)

root="$(cd "$(dirname "$0")/.." && pwd)"
bundle="$root/.gpu/bundle"
mkdir -p "$bundle"

# The version installed here (what the CPU build and tests use), else apt's candidate.
version_of() {
  local v
  v=$(dpkg-query -W -f='${Status} ${Version}' "$1" 2>/dev/null | sed -n 's/^install ok installed //p')
  if [ -z "$v" ]; then v=$(apt-cache policy "$1" | sed -n 's/^ *Candidate: //p'); fi
  if [ -z "$v" ] || [ "$v" = "(none)" ]; then
    echo "gpu-bundle: no version of $1 is installed or available from apt" >&2
    exit 1
  fi
  echo "$v"
}

manifest=$(mktemp)
trap 'rm -f "$manifest"' EXIT
keep=(MANIFEST)
for p in "${packages[@]}"; do
  want=$(version_of "$p")
  deb=""
  for f in "$bundle/${p}"_*.deb; do
    [ -f "$f" ] || continue
    if [ "$(dpkg-deb -f "$f" Package)" = "$p" ] && [ "$(dpkg-deb -f "$f" Version)" = "$want" ]; then deb="$f"; fi
  done
  if [ -z "$deb" ]; then
    for f in /var/cache/apt/archives/"${p}"_*.deb; do
      [ -f "$f" ] || continue
      if [ "$(dpkg-deb -f "$f" Package)" = "$p" ] && [ "$(dpkg-deb -f "$f" Version)" = "$want" ]; then
        echo "gpu-bundle: $p=$want from apt's cache"
        cp "$f" "$bundle/" && deb="$bundle/$(basename "$f")"
        break
      fi
    done
  fi
  if [ -z "$deb" ]; then
    echo "gpu-bundle: downloading $p=$want"
    (cd "$bundle" && apt-get download -q -o APT::Sandbox::User=root "$p=$want" > /dev/null)
    for f in "$bundle/${p}"_*.deb; do
      if [ "$(dpkg-deb -f "$f" Version)" = "$want" ]; then deb="$f"; fi
    done
    test -n "$deb" || { echo "gpu-bundle: apt-get download of $p=$want left no .deb" >&2; exit 1; }
  fi
  keep+=("$(basename "$deb")")
  printf '%s %s %s %s %s\n' "$p" "$want" "$(dpkg-deb -f "$deb" Architecture)" \
    "$(sha256sum "$deb" | cut -d' ' -f1)" "$(basename "$deb")" >> "$manifest"
done

# Drop anything else (other versions, stray files) so only what MANIFEST lists travels.
for f in "$bundle"/* "$bundle"/.[!.]*; do
  [ -e "$f" ] || continue
  name=$(basename "$f")
  printf '%s\n' "${keep[@]}" | grep -qxF "$name" || { echo "gpu-bundle: removing stale $name"; rm -rf "$f"; }
done
if ! cmp -s "$manifest" "$bundle/MANIFEST"; then install -m 644 "$manifest" "$bundle/MANIFEST"; fi

# What the GPU machine receives: tracked and untracked-but-not-ignored files, plus the carried
# bundle and data slice (64 MiB in all).
tree_bytes=$(cd "$root" && { git ls-files -z -co --exclude-standard | xargs -0 -r stat -c %s -- 2> /dev/null || true; } |
             awk '{s += $1} END {print s + 0}')
bundle_bytes=$(du -sb "$bundle" | cut -f1)
carry='".gpu/bundle"'
data_bytes=0
if [ -d "$root/.gpu/data" ]; then
  data_bytes=$(du -sb "$root/.gpu/data" | cut -f1)
  carry="$carry, \".gpu/data\""
fi
total=$((tree_bytes + bundle_bytes + data_bytes))
limit=$((64 * 1024 * 1024))
mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }
echo "gpu-bundle: .gpu/bundle $(mib "$bundle_bytes") MiB ($(wc -l < "$bundle/MANIFEST") packages); .gpu/data $(mib "$data_bytes") MiB; tree $(mib "$tree_bytes") MiB; travels $(mib "$total") MiB of 64 MiB"
echo "gpu-bundle: carry [$carry]"
if [ "$total" -gt "$limit" ]; then
  echo "gpu-bundle: the tree that travels exceeds 64 MiB" >&2
  exit 1
fi
