#!/usr/bin/env bash
# Installs every Debian package attnres needs to build, test and run its demo.
# Idempotent: when everything is present it only asks dpkg and exits.
set -euo pipefail

packages=(
  build-essential cmake pkg-config make
  ninja-build                  # the GPU-check build (tests/gpu/check.sh, device-run.sh) and its rehearsal
  libgtest-dev libgmock-dev libbenchmark-dev
  libopenblas-openmp-dev       # CBLAS GEMMs (the OpenMP build: one thread pool with the model's loops)
  nlohmann-json3-dev           # JSON: configs in safetensors headers, manifests, metrics
  libcli11-dev                 # command-line parsing
  libtomlplusplus-dev          # TOML training configs
  libboost-dev                 # Boost.Math (header-only): t and non-central t distributions, power analysis
  zlib1g-dev                   # gzip-compressed corpora
  libxxhash-dev                # XXH3 checksums of safetensors payloads
  libsentencepiece-dev         # sp: tokenizers (training and encoding)
  libopenmpi-dev openmpi-bin   # data-parallel training and sweeps
  python3 python3-torch python3-numpy   # independent reference implementation in the tests
  python3-venv python3-pip python3-setuptools   # the Python package's offline install (docs/python.md)
  python3-sentencepiece        # the Python package's sp: tokenizers
  python3-xxhash               # the Python package's XXH3 checksums of safetensors files (else libxxhash0 via ctypes)
  python3-pandas python3-matplotlib   # Experiment.frame and the docs/python.md walk-through (tested)
  python3-scipy                # scripts/precision_effect.py: the t interval of the bf16 loss effect
  python3-doc                  # the offline default corpus (Python docs reST sources)
  clang libclang-rt-14-dev libomp-dev   # libFuzzer targets (make fuzz): clang, its runtimes, its OpenMP
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
