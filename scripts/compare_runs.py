#!/usr/bin/env python3
"""Compares two training runs of the same configuration: their weights (model.safetensors, every
tensor's bytes) and their training curves (metrics.jsonl, the loss and gradient norm of every step
both logged). tests/gpu/device-run.sh uses it for a run interrupted and resumed against one that was
not (phase `resume`: the same device, so the same bits where the device is deterministic) and for a
run continued on the other device (phase `eval`: within a tolerance).

  scripts/compare_runs.py RUN_A RUN_B [--tolerance REL] [--json FILE]

Without --tolerance the runs must be bit-identical (exit 0), else exit 1. With --tolerance, the
last logged training loss (and the last validation loss when both log one) must agree within that
relative difference. The last line printed is the verdict. Standard library only (the GPU machine's
python3 need not have numpy or the package's dependencies).
"""
import argparse
import json
import math
import os
import struct
import sys
from array import array


def read_safetensors(path):
    """{name: (dtype, shape, bytes)} of a safetensors file (header length, JSON header, data)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    tensors = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        begin, end = t["data_offsets"]
        tensors[name] = (t["dtype"], tuple(t["shape"]), data[begin:end])
    return tensors


def read_metrics(path):
    """{(step, kind): {key: value}} of metrics.jsonl, numeric values only; kind "val" for an
    evaluation line (val_nll), else "train"."""
    rows = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            r = json.loads(line)
            if "step" in r:
                kind = "val" if any(k.startswith("val_") for k in r) else "train"
                rows[(r["step"], kind)] = {k: v for k, v in r.items() if isinstance(v, (int, float))}
    return rows


# Keys that are the run's computation (not wall times, throughput or memory).
def computed(key):
    return any(w in key for w in ("loss", "grad_norm", "nll", "ppl", "lr")) and "time" not in key


def max_rel_diff(a, b):
    x, y = array("f"), array("f")
    x.frombytes(a)
    y.frombytes(b)
    return max((abs(p - q) / max(abs(p), abs(q), 1e-30) for p, q in zip(x, y)), default=0.0)


def compare(a_dir, b_dir):
    out = {"a": a_dir, "b": b_dir}
    wa = read_safetensors(os.path.join(a_dir, "model.safetensors"))
    wb = read_safetensors(os.path.join(b_dir, "model.safetensors"))
    out["tensors"] = len(wa)
    out["tensor_names_equal"] = sorted(wa) == sorted(wb)
    differing = [n for n in wa if n in wb and wa[n][2] != wb[n][2]]
    out["tensors_differing"] = len(differing)
    out["weights_max_rel_diff"] = max((max_rel_diff(wa[n][2], wb[n][2]) for n in differing
                                       if wa[n][0] == "F32" and wb[n][0] == "F32"), default=0.0)
    ma = read_metrics(os.path.join(a_dir, "metrics.jsonl"))
    mb = read_metrics(os.path.join(b_dir, "metrics.jsonl"))
    common = sorted(set(ma) & set(mb))
    out["lines_compared"] = len(common)
    out["lines_a"], out["lines_b"] = len(ma), len(mb)
    worst, first_diff = 0.0, None
    for key in common:
        ra, rb = ma[key], mb[key]
        for k in ra:
            if computed(k) and k in rb and ra[k] != rb[k]:
                d = abs(ra[k] - rb[k]) / max(abs(ra[k]), abs(rb[k]), 1e-30)
                worst = max(worst, d)
                if first_diff is None:
                    first_diff = f"step {key[0]} {k}: {ra[k]!r} vs {rb[k]!r}"
    out["metrics_max_rel_diff"] = worst
    out["metrics_first_difference"] = first_diff

    def last(rows, kind, key):
        steps = sorted(s for s, k in rows if k == kind and key in rows[(s, k)])
        return rows[(steps[-1], kind)][key] if steps else None

    out["final_train_loss"] = [last(ma, "train", "loss"), last(mb, "train", "loss")]
    out["final_val_loss"] = [last(ma, "val", "val_nll"), last(mb, "val", "val_nll")]
    out["bit_identical"] = (out["tensor_names_equal"] and not differing and first_diff is None
                            and set(ma) == set(mb))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_a")
    ap.add_argument("run_b")
    ap.add_argument("--tolerance", type=float, help="pass when the final losses agree within this relative difference")
    ap.add_argument("--json", help="also write the comparison here")
    args = ap.parse_args(argv)
    try:
        r = compare(args.run_a, args.run_b)
    except (OSError, ValueError, KeyError) as e:
        print(f"compare_runs: {e}")
        return 1
    print(f"weights: {r['tensors']} tensors, {r['tensors_differing']} differ (max relative difference "
          f"{r['weights_max_rel_diff']:.3g})")
    print(f"metrics: {r['lines_compared']} lines compared ({r['lines_a']} and {r['lines_b']} logged), max relative "
          f"difference {r['metrics_max_rel_diff']:.3g}" +
          (f", first at {r['metrics_first_difference']}" if r["metrics_first_difference"] else ""))
    ok = r["bit_identical"]
    if args.tolerance is not None:
        pairs = [p for p in (r["final_train_loss"], r["final_val_loss"]) if None not in p]
        rel = max((abs(a - b) / max(abs(a), abs(b)) for a, b in pairs), default=float("inf"))
        r["final_loss_rel_diff"] = rel
        ok = bool(pairs) and rel <= args.tolerance
        verdict = (f"final losses {r['final_train_loss']} / val {r['final_val_loss']}: relative difference "
                   f"{rel:.3g} {'within' if ok else 'OUTSIDE'} {args.tolerance}")
    else:
        verdict = "bit-identical" if ok else "NOT bit-identical"
    r["ok"] = ok
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=2)
            f.write("\n")
    print(verdict)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
