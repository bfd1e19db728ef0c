#!/usr/bin/env python3
"""Step time by kernel family from Nsight Compute's CSV (tests/gpu/profile.sh).

Reads `ncu -i REPORT --csv --print-units base` output holding gpu__time_duration.sum per kernel
launch, splits the launches into arms at each AdamW kernel (one training step per arm: the
check's block arm, then rd), and prints per arm the kernel time by family and the 12 longest
kernels. Kernel time under ncu is serialised (no overlap), so it is an upper bound on the
step's device time; its shares are what count.

    tests/gpu/kernel_times.py kernels.csv     (or kernels.csv.gz)
"""
import csv
import gzip
import sys
from collections import defaultdict

FAMILIES = [  # (family, substrings of the kernel's function name), first match wins
    # the project's kernels (attn_*) and cuDNN's fused attention (its names carry sdpa / flash /
    # fmha; before the GEMM family, whose "sm90" they may also contain)
    ("attention", ("attn_", "sdpa", "flash", "fmha")),
    ("depth read", ("depth_read",)),
    ("DenseFormer DWA", ("dwa_",)),
    ("value residual", ("value_residual", "add_fp32")),
    ("rmsnorm", ("rmsnorm",)),
    ("swiglu", ("swiglu",)),
    ("cross-entropy", ("cross_entropy",)),
    ("embedding", ("embedding",)),
    ("rope", ("rope",)),
    ("optimizer (clip, norms, AdamW)", ("adamw", "clip", "sum_squares", "sum_doubles", "sum_chunks", "divide")),
    ("casts and adds", ("add_and_cast",)),
    ("GEMM (cuBLASLt)", ("gemm", "nvjet", "cutlass", "xmma", "sm90", "gemv", "splitk", "reduce")),
]
ARM_NAMES = ["block", "rd"]


def family(name: str) -> str:
    low = name.lower()
    for fam, keys in FAMILIES:
        if any(k in low for k in keys):
            return fam
    return "other"


def read_launches(path):
    launches = {}  # id -> (name, ns)
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        lines = [line for line in f if line.startswith('"')]  # ncu's own messages are not CSV rows
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(row["Metric Value"].replace(",", ""))
        unit = row.get("Metric Unit", "ns").strip().lower()
        scale = {"ns": 1, "nsecond": 1, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6}.get(unit, 1)
        launches[int(row["ID"])] = (row["Kernel Name"], value * scale)
    return [launches[i] for i in sorted(launches)]


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    launches = read_launches(sys.argv[1])
    if not launches:
        print(f"kernel_times: no gpu__time_duration.sum rows in {sys.argv[1]}")
        return 1
    arms, current = [], []
    for name, ns in launches:
        current.append((name, ns))
        if "adamw" in name.lower():
            arms.append(current)
            current = []
    if current:
        arms.append(current)
    totals = []
    for i, arm in enumerate(arms):
        label = ARM_NAMES[i] if i < len(ARM_NAMES) and len(arms) <= len(ARM_NAMES) else f"segment {i}"
        total = sum(ns for _, ns in arm)
        totals.append(total)
        print(f"{label}: {len(arm)} launches, {total / 1e6:.2f} ms of kernel time")
        by_family = defaultdict(lambda: [0.0, 0])
        by_kernel = defaultdict(lambda: [0.0, 0])
        for name, ns in arm:
            by_family[family(name)][0] += ns
            by_family[family(name)][1] += 1
            by_kernel[name][0] += ns
            by_kernel[name][1] += 1
        for fam, (ns, n) in sorted(by_family.items(), key=lambda kv: -kv[1][0]):
            print(f"  {fam:32s} {ns / 1e6:9.2f} ms {100 * ns / total:6.1f}%  {n:5d} launches")
        print("  longest kernels:")
        for name, (ns, n) in sorted(by_kernel.items(), key=lambda kv: -kv[1][0])[:12]:
            print(f"    {name[:60]:60s} {ns / 1e6:9.2f} ms {100 * ns / total:6.1f}%  {n:5d}")
    if len(totals) == 2:
        print(f"rd/block kernel time: {totals[1] / totals[0]:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
