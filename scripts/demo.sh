#!/usr/bin/env bash
# The demo: prepare the offline default corpus (Python documentation sources from Debian's
# python3-doc, with a SentencePiece tokenizer trained on it), run a paired Block vs RD-AttnRes
# experiment of the tiny preset with 3 seeds, print the summary and write the report.
# Rerunning resumes: the prepared data and finished runs are reused.
set -euo pipefail
build=${1:-build}
bin="$build/src/cli/attnres"
data=${ATTNRES_DEMO_DATA:-data/python-docs}
out=${ATTNRES_DEMO_OUT:-runs/demo}

if [ ! -f "$data/manifest.json" ]; then
  "$bin" prepare --out "$data" --val-fraction 0.03 --test-fraction 0.03
fi
"$bin" experiment --preset tiny --arms block,rd --seeds 1,2,3 --data "$data" --out "$out"
"$bin" report --experiment "$out" --quiet  # the experiment printed the summary
echo
echo "Open $out/report.html in a browser; the numbers are in $out/summary.json."
