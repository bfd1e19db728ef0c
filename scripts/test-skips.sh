#!/usr/bin/env bash
# Prints every test the last ctest run in BUILD skipped, with the reason the test gave
# (GTEST_SKIP's message), so a skip is never silent: `make test` and `.ci/run` call it.
#   scripts/test-skips.sh BUILD
set -euo pipefail
log="${1:-build}/Testing/Temporary/LastTest.log"
[[ -f "$log" ]] || exit 0
awk '
  /^[0-9]+\/[0-9]+ Test: / { name = $3; reason = ""; in_reason = 0; next }
  /: Skipped$/ { in_reason = 1; next }
  in_reason && /^\[  SKIPPED \]/ { in_reason = 0; next }
  in_reason { reason = reason (reason == "" ? "" : " | ") $0; next }
  /^Skip regular expression found in output/ { printf "skipped: %s: %s\n", name, (reason == "" ? "(no reason given)" : reason); count++ }
  END { if (count > 0) printf "%d test(s) skipped, reasons above\n", count }
' "$log"
