#!/usr/bin/env bash
# Times `attnres prepare` on the shared corpus (../shared/data/corpus, ~66 MB of JSONL):
#   1. prepare with the GPT-2 tokenizer            (target: under 60 s on 2 cores)
#   2. train a SentencePiece tokenizer on the corpus (timed separately)
#   3. prepare with that SentencePiece tokenizer
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

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
tokens() { python3 -c 'import json,sys; m=json.load(open(sys.argv[1])); print(sum(s["tokens"] for s in m["splits"].values()))' "$1"; }

corpus="$shared/corpus"
mb=$(du -sbL "$corpus" | awk '{ printf "%.1f", $1 / 1e6 }')
echo "prepare_bench: corpus $corpus ($mb MB), $(nproc) cores, threads=$threads, load $(cut -d' ' -f1-3 /proc/loadavg)"

t0=$(now)
"$bin" prepare --quiet --threads "$threads" --input "$corpus" --tokenizer "gpt2:$shared/tokenizers/gpt2" --out "$work/gpt2"
t1=$(now)
echo "gpt2 prepare:       $(elapsed "$t0" "$t1") s, $(tokens "$work/gpt2/manifest.json") tokens"

t0=$(now)
"$bin" tokenizer train --quiet --threads "$threads" --input "$corpus" --vocab-size "$sp_vocab" --out "$work/sp.model"
t1=$(now)
echo "sp train (vocab $sp_vocab): $(elapsed "$t0" "$t1") s"

t0=$(now)
"$bin" prepare --quiet --threads "$threads" --input "$corpus" --tokenizer "sp:$work/sp.model" --out "$work/sp"
t1=$(now)
echo "sp prepare:         $(elapsed "$t0" "$t1") s, $(tokens "$work/sp/manifest.json") tokens"
