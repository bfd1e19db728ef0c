#!/usr/bin/env bash
# The demo: prepare the offline default corpus (Python documentation sources from Debian's
# python3-doc, with a SentencePiece tokenizer trained on it), run the paired Block vs RD-AttnRes
# protocol studies/demo.toml (planned by `attnres plan` from studies/demo.pilot.toml: both arms'
# twins, sequential seeds) with two runs at a time (one per core; both workers take each look's
# runs), write the report and end with the one-line answer. Rerunning resumes: the prepared data
# and finished runs are reused.
set -euo pipefail
build=${1:-build}
bin="$build/src/cli/attnres"
data=data/python-docs   # studies/demo.toml reads it from here
out=${ATTNRES_DEMO_OUT:-runs/demo}

if [ ! -f "$data/manifest.json" ]; then
  "$bin" prepare --out "$data" --val-fraction 0.03 --test-fraction 0.03
fi
mkdir -p "$(dirname "$out")"
# Two workers, one thread each (the protocol's train.threads): each takes every other run.
"$bin" experiment --protocol studies/demo.toml --out "$out" --worker 1/2 > "$out.worker1.log" 2>&1 &
worker=$!
trap 'kill $worker 2>/dev/null || true' EXIT
"$bin" experiment --protocol studies/demo.toml --out "$out" --worker 0/2
wait $worker || { echo "demo: the second worker failed; its log: $out.worker1.log" >&2; exit 1; }
trap - EXIT
"$bin" report --experiment "$out"
echo
echo "Open $out/report.html in a browser; the numbers are in $out/summary.json."
echo
echo "Answer: $("$bin" report --experiment "$out" --answer rd)"
