#!/usr/bin/env bash
# The corpus slice the GPU machine's mini-study trains on (tests/gpu/device-run.sh, phases study,
# resume and eval): whole documents from the head of ../shared/data's corpus (an OpenStax file and a
# FineWeb file, MIB/2 MiB of each, default 3 MiB in all) into .gpu/data/corpus/ (ignored by git:
# the data is third-party and never committed; it travels as a carried path, [".gpu/data"]).
# Idempotent: rewritten only when the sources or the size changed.
#
#   scripts/gpu-data-slice.sh [MIB]     SHARED_DATA (default ../shared/data beside the checkout)
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
mib="${1:-3}"
shared="${SHARED_DATA:-$root/../shared/data}"
dest="$root/.gpu/data/corpus"
case "$mib" in '' | *[!0-9]*) echo "gpu-data-slice: MIB must be a whole number, not '$mib'" >&2; exit 2 ;; esac
sources=("$shared/corpus/openstax/openstax_000.jsonl" "$shared/corpus/fineweb-sample/fineweb_000.jsonl")
for f in "${sources[@]}"; do test -f "$f" || { echo "gpu-data-slice: no $f (SHARED_DATA=$shared)" >&2; exit 1; }; done
stamp="$mib $(stat -c '%s %Y' "${sources[@]}" | tr '\n' ' ')"
if [ -f "$dest/.stamp" ] && [ "$(cat "$dest/.stamp")" = "$stamp" ]; then
  echo "gpu-data-slice: $dest is up to date ($(du -sh "$dest" | cut -f1))"
  exit 0
fi
rm -rf "$dest"
mkdir -p "$dest"
per=$((mib * 1048576 / ${#sources[@]}))
for f in "${sources[@]}"; do
  # Whole lines (one JSON document each) while the running size stays under the share.
  awk -v limit="$per" '{ n += length($0) + 1; if (n > limit) exit; print }' "$f" > "$dest/$(basename "$f")"
done
echo "$stamp" > "$dest/.stamp"
echo "gpu-data-slice: $(ls "$dest" | grep -c jsonl) files, $(cat "$dest"/*.jsonl | wc -l) documents, $(du -sh "$dest" | cut -f1) in $dest"
