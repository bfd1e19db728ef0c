#!/usr/bin/env python3
"""Where the training steps' time goes, without the benchmark's setup: two perf profiles, subtracted.

A `perf record` of `attnres bench` counts its setup (building the model, touching the activation
arena, the sgemm reference) together with its steps, and call-graph unwinding cannot reliably
tell them apart (frames of several KB defeat `--call-graph dwarf`). Profile the same command
twice, with few steps and with many; the setup is the same in both, so the difference of the two
profiles' sample counts, function by function, is the extra steps' own profile:

    O="bench --config bench/configs/study-d64x12.toml --arms block --threads 1 --torch off --no-paired --warmup 1"
    perf record -e cpu-clock -F 999 -o short.data -- attnres $O --steps 5
    perf record -e cpu-clock -F 999 -o long.data -- attnres $O --steps 45
    scripts/perf_step_shares.py short.data long.data [--top N]

Each function's share is (its samples in long - in short) / (all samples in long - in short).
A function whose difference is within a few samples of zero is noise; a negative difference
means the two setups differed (another process took the core) and the pair should be rerun.
"""
import argparse
import collections
import re
import subprocess
import sys


# A row of `perf report -F overhead,sample,sym --stdio`: "    51.76%          3741  [.] name".
_ROW = re.compile(r"^\s*[0-9.]+%\s+([0-9]+)\s+\[[^\]]+\]\s+(.*\S)\s*$")


def parse_report(text):
    """Samples per function (self time) from the text of `perf report -F overhead,sample,sym`."""
    out = collections.Counter()
    for line in text.splitlines():
        m = _ROW.match(line)
        if m:
            # Unresolved addresses differ from run to run: one bucket, so that they can cancel.
            name = "[unresolved addresses]" if re.fullmatch(r"0x[0-9a-f]+", m.group(2)) else m.group(2)
            out[name] += int(m.group(1))
    return out


def step_shares(short, long):
    """(steps' samples, [(function, share, samples)] largest first, setup scatter as a share)."""
    total = sum(long.values()) - sum(short.values())
    if total <= 0:
        raise ValueError("the second profile has no more samples than the first: give it more steps")
    diff = {name: long[name] - short[name] for name in set(short) | set(long)}
    rows = [(name, n / total, n) for name, n in sorted(diff.items(), key=lambda kv: (-kv[1], kv[0]))]
    # Functions with fewer samples in the longer run: the setups' own scatter, the error bar.
    scatter = -sum(n for n in diff.values() if n < 0) / total
    return total, rows, scatter


def counts(path):
    """Samples per function in one perf.data file."""
    try:
        text = subprocess.run(["perf", "report", "-i", path, "--no-children", "-F", "overhead,sample,sym",
                               "--stdio", "-g", "none"], check=True, capture_output=True, text=True).stdout
    except FileNotFoundError:
        sys.exit("perf_step_shares: perf is not installed (Debian package linux-perf)")
    except subprocess.CalledProcessError as e:
        sys.exit(f"perf_step_shares: perf report -i {path} failed: {e.stderr.strip()}")
    out = parse_report(text)
    if not out:
        sys.exit(f"perf_step_shares: no samples in {path}")
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("short", help="perf.data of the run with few steps")
    parser.add_argument("long", help="perf.data of the same run with many steps")
    parser.add_argument("--top", type=int, default=30, help="functions to list (default 30)")
    args = parser.parse_args()
    short, long = counts(args.short), counts(args.long)
    try:
        total, rows, scatter = step_shares(short, long)
    except ValueError as e:
        sys.exit(f"perf_step_shares: {args.long}: {e}")
    print(f"steps' samples: {total} ({sum(long.values())} - {sum(short.values())}); self time of each function:")
    for name, share, n in rows[: args.top]:
        print(f"{100.0 * share:6.2f}%  {n:6d}  {name}")
    print(f"(setup scatter: functions with fewer samples in the long run, {100.0 * scatter:.2f}% in all)")


if __name__ == "__main__":
    main()
