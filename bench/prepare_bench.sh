#!/usr/bin/env bash
# Times `attnres prepare` on the shared corpus (../shared/data/corpus, ~66 MB of JSONL):
#   1. prepare with the GPT-2 tokenizer            (target: under 60 s on 2 cores)
#   2. train a SentencePiece tokenizer on the corpus (timed separately)
#   3. prepare with that SentencePiece tokenizer
#   4. the offline default path: `attnres prepare --out DIR` (python3-doc, sp training included)
# Usage: bench/prepare_bench.sh [ATTNRES_BINARY] [SHARED_DATA_DIR]
# Defaults: build-data/src/cli/attnres (or build/src/cli/attnres) and ../shared/data.
# Environment: SP_VOCAB (default 16384), THREADS (default 0 = all cores), KEEP=1 keeps outputs.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${1:-}"
if [ -z "$bin" ]; then
  for candidate in "$root/build-data/src/cli/attnres" "$root/build/src/cli/attnres"; do
    if [ -x "$candidate" ]; then bin="$candidate"; break; fi
  done
fi
shared="${2:-$root/../shared/data}"
sp_vocab="${SP_VOCAB:-16384}"
threads="${THREADS:-0}"
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
  echo "prepare_bench: no attnres binary (build it, or pass its path)" >&2
  exit 1
fi
if [ ! -d "$shared/corpus" ] || [ ! -f "$shared/tokenizers/gpt2/encoder.json" ]; then
  echo "prepare_bench: shared data not found under $shared" >&2
  exit 1
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/attnres_prepare_bench.XXXXXX")"
if [ "${KEEP:-0}" != 1 ]; then trap 'rm -rf "$work"' EXIT; fi

# Runs a command and prints "WALL CPU" seconds (CPU = user + system of the command and its children).
timed() {
  local t0 t1 c0 c1 self=$BASHPID
  t0=$(date +%s.%N)
  c0=$(awk '{ print $14 + $15 + $16 + $17 }' "/proc/$self/stat")
  "$@" >&2
  t1=$(date +%s.%N)
  c1=$(awk '{ print $14 + $15 + $16 + $17 }' "/proc/$self/stat")
  awk -v a="$t0" -v b="$t1" -v c="$c0" -v d="$c1" -v hz="$(getconf CLK_TCK)" \
    'BEGIN { printf "%.1f s wall, %.1f s CPU", b - a, (d - c) / hz }'
}
tokens() { python3 -c 'import json,sys; m=json.load(open(sys.argv[1])); print(sum(s["tokens"] for s in m["splits"].values()))' "$1"; }

corpus="$shared/corpus"
mb=$(du -sbL "$corpus" | awk '{ printf "%.1f", $1 / 1e6 }')
echo "prepare_bench: corpus $corpus ($mb MB), $(nproc) cores, threads=$threads, load $(cut -d' ' -f1-3 /proc/loadavg)"

r=$(timed "$bin" prepare --quiet --threads "$threads" --input "$corpus" --tokenizer "gpt2:$shared/tokenizers/gpt2" --out "$work/gpt2")
echo "gpt2 prepare:             $r, $(tokens "$work/gpt2/manifest.json") tokens"

r=$(timed "$bin" tokenizer train --quiet --threads "$threads" --input "$corpus" --vocab-size "$sp_vocab" --out "$work/sp.model")
echo "sp train (vocab $sp_vocab):  $r"

r=$(timed "$bin" prepare --quiet --threads "$threads" --input "$corpus" --tokenizer "sp:$work/sp.model" --out "$work/sp")
echo "sp prepare:               $r, $(tokens "$work/sp/manifest.json") tokens"

# The offline default path of the demo: python3-doc sources, a 4096-piece sp tokenizer trained on them.
if ls -d /usr/share/doc/python3*/html/_sources >/dev/null 2>&1; then
  r=$(timed "$bin" prepare --quiet --threads "$threads" --out "$work/default")
  echo "default corpus prepare:   $r (sp training included), $(tokens "$work/default/manifest.json") tokens"
fi
