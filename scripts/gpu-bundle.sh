#!/usr/bin/env bash
# Collects what the GPU-check build (cmake -DATTNRES_GPU_CHECK_ONLY=ON) needs beyond a compiler,
# CMake and the CUDA toolkit into .gpu/bundle/ (ignored by git), for a bare GPU machine that has
# none of the Debian packages and no network (docs/cuda.md "Running on a bare GPU machine"):
#
#   libopenblas-openmp-dev   cblas.h and the static libopenblas.a (linked in: no libopenblas.so,
#                            libgfortran or glibc-version dependency travels; libgomp is the
#                            GPU machine's compiler's own)
#   nlohmann-json3-dev       header-only
#   libtomlplusplus-dev      its headers, used header-only (its shared library is not needed)
#   libxxhash-dev            xxhash.h, used header-only (safetensors digests, src/util/checksum.cpp)
#
# The .deb files of the versions installed here (scripts/install-deps.sh), as apt-get download
# fetches them, and MANIFEST (package, version, architecture, sha256, file). tests/gpu/device-run.sh
# unpacks them into a scratch prefix there. Idempotent: files already present with the right
# version are kept. Prints the bundle's size, the size of the tree that travels and the carry list.
#
#   scripts/gpu-bundle.sh            (needs apt-get and the network unless the files are present)
set -euo pipefail

packages=(libopenblas-openmp-dev nlohmann-json3-dev libtomlplusplus-dev libxxhash-dev)

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
# bundle (64 MiB in all).
tree_bytes=$(cd "$root" && { git ls-files -z -co --exclude-standard | xargs -0 -r stat -c %s -- 2> /dev/null || true; } |
             awk '{s += $1} END {print s + 0}')
bundle_bytes=$(du -sb "$bundle" | cut -f1)
total=$((tree_bytes + bundle_bytes))
limit=$((64 * 1024 * 1024))
echo "gpu-bundle: .gpu/bundle $(awk -v b="$bundle_bytes" 'BEGIN {printf "%.1f", b / 1048576}') MiB ($(wc -l < "$bundle/MANIFEST") packages); tree $(awk -v b="$tree_bytes" 'BEGIN {printf "%.1f", b / 1048576}') MiB; travels $(awk -v b="$total" 'BEGIN {printf "%.1f", b / 1048576}') MiB of 64 MiB"
echo 'gpu-bundle: carry [".gpu/bundle"]'
if [ "$total" -gt "$limit" ]; then
  echo "gpu-bundle: the tree that travels exceeds 64 MiB" >&2
  exit 1
fi
