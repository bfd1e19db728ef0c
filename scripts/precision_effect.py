#!/usr/bin/python3
"""The loss effect of bf16 matmuls: pairs each run of an experiment's main arms (fp32) with the run of
the same arm and seed in its `bf16` probe group (studies/precision.toml), and prints, per arm, the mean
paired difference of test NLL (bf16 - fp32) with its two-sided 95% t interval, and the tokens/s ratio.

    scripts/precision_effect.py runs/precision [--group bf16] [--json]

Runs of the same seed start from the same weights and read the same batches, so the difference is
the effect of the precision alone (plus the chaotic divergence of two trainings; the interval covers it).
"""
import argparse
import json
import math
import os
import statistics
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), os.pardir, "python"))

import attnres  # noqa: E402


def t_quantile_975(df: int) -> float:
    from scipy.stats import t  # Debian's python3-scipy
    return float(t.ppf(0.975, df))


def effect(experiment_dir: str, group: str) -> list:
    exp = attnres.read_experiment(experiment_dir)
    if group not in exp.groups:
        raise SystemExit(f"precision_effect: {experiment_dir} has no group '{group}' (groups: {', '.join(exp.groups) or 'none'})")
    probe = exp.groups[group]
    rows = []
    for arm in [a for a in exp.arms if a in probe.arms]:
        pairs = []
        for seed in exp.seeds:
            try:
                a, b = exp.run(arm, seed), probe.run(arm, seed)
            except KeyError:
                continue
            pairs.append((seed, a, b))
        d = [b.test_nll - a.test_nll for _, a, b in pairs]
        speed = [b.tokens_per_sec / a.tokens_per_sec for _, a, b in pairs]
        row = {"arm": arm, "n": len(d), "seeds": [s for s, _, _ in pairs], "delta_test_nll": d}
        if len(d) >= 2:
            mean, sd = statistics.fmean(d), statistics.stdev(d)
            half = t_quantile_975(len(d) - 1) * sd / math.sqrt(len(d))
            row.update(mean=mean, sd=sd, ci95_low=mean - half, ci95_high=mean + half,
                       tokens_per_sec_ratio=statistics.median(speed))
        rows.append(row)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("experiment", help="the experiment directory (studies/precision.toml's --out)")
    ap.add_argument("--group", default="bf16", help="the probe group that ran in bf16 (default bf16)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args()
    rows = effect(args.experiment, args.group)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print("arm      n   test NLL bf16 - fp32 (mean, 95% t interval, sd)      tokens/s bf16 / fp32")
    for r in rows:
        if "mean" not in r:
            print(f"{r['arm']:<8} {r['n']:<3} fewer than 2 paired seeds")
            continue
        print(f"{r['arm']:<8} {r['n']:<3} {r['mean']:+.4f}  [{r['ci95_low']:+.4f}, {r['ci95_high']:+.4f}]  sd {r['sd']:.4f}"
              f"           {r['tokens_per_sec_ratio']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
