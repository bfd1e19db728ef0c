#!/usr/bin/env python3
"""The fair PyTorch peer of `attnres bench --device cuda` (tests/gpu/device-run.sh, phase `peer`).

Trains the Python package's model (python/attnres: the same architecture, every residual mode) on
the same device with what a PyTorch user would use there: bf16 torch.autocast, torch.compile of the
forward and loss (its backward compiled by AOTAutograd), F.scaled_dot_product_attention (the fused
flash kernels; `AttnResModel.set_attention("sdpa")`) and the fused AdamW. Everything else is
`attnres bench`'s, read from its --json-file output: each run's arm (its model config), batch and
sequence length; the step (zero_grad, forward, cross-entropy, backward, clip_grad_norm_(1.0),
AdamW lr 1e-3, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on attnres' decayed tensors, new
random tokens every step); its step counts; and its FLOP count per token and bf16 GEMM reference
rate, so that the MFU of both sides is against the same rate (--gemm-tflops overrides it).

Prints one line per arm and, with --json-file, writes one JSON object {"runs": [...]}: tokens/s,
median step time, MFU, peak memory (torch.cuda.max_memory_allocated; on the CPU the process's
VmHWM), the compile time (the first step's time less a timed step's: torch.compile's tracing and
code generation, reported apart from the throughput), and attnres' tokens/s over torch's.

  scripts/torch_peer.py --bench-json bench-S.json [--device cuda] [--arms block,rd] [--steps N]
      [--warmup W] [--no-compile] [--attention auto|sdpa|matmul] [--gemm-tflops X] [--json-file F]

On a CPU with Debian's torch 1.13 (no torch.compile, no SDPA): --device cpu --no-compile, and
--attention auto falls back to the package's matmul attention (recorded in the output).
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.dont_write_bytecode = True  # leave no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), os.pardir, "python"))

from attnres.bench_worker import optimizer, vm_kb  # noqa: E402  (sets OMP_WAIT_POLICY before torch loads)
from attnres.config import ModelConfig  # noqa: E402
from attnres.model import AttnResModel, sdpa_available  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def reference_gflops(bench):
    """The GEMM rate bench states bf16 MFU against (its fp32 one for an fp32 bench), GFLOP/s."""
    refs = bench["mfu_reference"]
    rate = refs.get("bf16", refs["fp32"])  # the chosen rate (its candidates beside it)
    return rate["gflops"], f"{rate['impl']} {rate['op']} {rate['shape']}"


def model_config(bench, run):
    """The arm's model config: the run's own (bench writes it), else the base with the arm as residual."""
    if "model" in run:
        return ModelConfig.from_json(json.dumps(run["model"]), where="bench run")
    base = ModelConfig.from_json(json.dumps(bench["config"]), where="bench config")
    return base.replace(residual=run["arm"].split("@")[0])


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_arm(cfg, batch, seq, args, device):
    if seq > cfg.max_seq_len:
        cfg = cfg.replace(max_seq_len=seq)
    torch.manual_seed(args.seed)
    model = AttnResModel(cfg, seed=args.seed, device=device)
    attention = args.attention
    if attention == "auto":
        attention = "sdpa" if sdpa_available() else "matmul"
    model.set_attention(attention)
    params = list(model.parameters())
    opt = optimizer(model, foreach=device.type != "cuda", fused=device.type == "cuda")
    V = cfg.vocab_size
    bf16 = args.precision == "bf16"

    def forward_loss(inputs, targets):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(inputs)
            return F.cross_entropy(logits.view(-1, V), targets)  # autocast runs it in fp32

    step_fn = torch.compile(forward_loss) if args.compile else forward_loss
    g = torch.Generator(device="cpu").manual_seed(args.seed + 1)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    step_ms, losses = [], []
    first_ms = None
    for step in range(1 + args.warmup + args.steps):  # step 0 compiles
        tokens = torch.randint(0, V, (batch, seq + 1), generator=g).to(device, non_blocking=True)
        inputs, targets = tokens[:, :-1], tokens[:, 1:].reshape(-1)
        sync(device)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = step_fn(inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(loss.item())  # synchronises
        sync(device)
        ms = (time.perf_counter() - t0) * 1e3
        if step == 0:
            first_ms = ms
        elif step > args.warmup:
            step_ms.append(ms)
    median = statistics.median(step_ms)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else vm_kb("VmHWM") * 1024
    return {"step_ms": step_ms, "step_ms_median": median, "tokens_per_sec": batch * seq / (median / 1e3),
            "compile_s": max(0.0, (first_ms - median) / 1e3) if args.compile else 0.0, "first_step_ms": first_ms,
            "peak_memory_bytes": peak, "loss_first": losses[0], "loss_last": losses[-1], "attention": attention,
            "compiled": bool(args.compile), "params": sum(t.numel() for t in params)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench-json", required=True, help="attnres bench --json-file output (the runs to match)")
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    ap.add_argument("--arms", help="comma-separated subset of the bench's arms (default: all of them)")
    ap.add_argument("--steps", type=int, help="timed steps (default: the bench's)")
    ap.add_argument("--warmup", type=int, help="untimed steps after the compiling one (default: the bench's)")
    ap.add_argument("--precision", choices=("bf16", "fp32"), help="default: the bench's attnres precision")
    ap.add_argument("--attention", choices=("auto", "sdpa", "matmul"), default="auto",
                    help="auto: SDPA where this torch has it, else the package's matmul attention")
    ap.add_argument("--no-compile", dest="compile", action="store_false", help="eager (e.g. a CPU rehearsal)")
    ap.add_argument("--gemm-tflops", type=float, help="the MFU reference rate (default: the bench's)")
    ap.add_argument("--threads", type=int, help="torch's CPU threads (default: torch's)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json-file", help="also write the results here")
    args = ap.parse_args(argv)

    with open(args.bench_json) as f:
        bench = json.load(f)
    args.steps = bench.get("steps", 10) if args.steps is None else args.steps
    args.warmup = bench.get("warmup", 2) if args.warmup is None else args.warmup
    args.precision = args.precision or bench["precision"]["attnres"]
    if args.steps < 1 or args.warmup < 0:
        ap.error("--steps must be positive and --warmup non-negative")
    if args.compile and not hasattr(torch, "compile"):
        ap.error(f"torch {torch.__version__} has no torch.compile: pass --no-compile")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"torch_peer: no CUDA device for torch {torch.__version__}", file=sys.stderr)
        return 2
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # as attnres: fp32 GEMMs are fp32
    gflops, rate_text = reference_gflops(bench)
    if args.gemm_tflops:
        gflops, rate_text = args.gemm_tflops * 1e3, f"--gemm-tflops {args.gemm_tflops}"
    wanted = set(args.arms.split(",")) if args.arms else None
    out = {"torch_version": torch.__version__, "device": args.device,
           "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "precision": args.precision, "reference_gflops": gflops, "reference": rate_text,
           "bench_json": os.path.abspath(args.bench_json), "steps": args.steps, "warmup": args.warmup, "runs": []}
    for run in bench["runs"]:
        if run.get("impl", "attnres") != "attnres" or (wanted and run["arm"] not in wanted):
            continue
        cfg = model_config(bench, run)
        r = time_arm(cfg, run["batch"], run["seq"], args, device)
        flops = run["flops_per_token"]["total"]
        r.update({"arm": run["arm"], "seq": run["seq"], "batch": run["batch"], "flops_per_token": flops,
                  "mfu": flops * r["tokens_per_sec"] / (gflops * 1e9),
                  "attnres_tokens_per_sec": run["tokens_per_sec"], "attnres_mfu": run["mfu"],
                  "attnres_over_torch": run["tokens_per_sec"] / r["tokens_per_sec"]})
        out["runs"].append(r)
        print(f"torch_peer: {run['arm']:<8} B={run['batch']} T={run['seq']}: {r['tokens_per_sec']:.0f} tokens/s "
              f"(attnres {run['tokens_per_sec']:.0f}), step {r['step_ms_median']:.1f} ms, MFU {100 * r['mfu']:.1f}% "
              f"vs {rate_text} ({gflops / 1e3:.1f} TFLOP/s), compile {r['compile_s']:.1f} s, "
              f"peak {r['peak_memory_bytes'] / 2**30:.2f} GiB, attention {r['attention']}, loss "
              f"{r['loss_first']:.3f} -> {r['loss_last']:.3f}", flush=True)
    if not out["runs"]:
        print("torch_peer: the bench JSON has no attnres run to match", file=sys.stderr)
        return 1
    if args.json_file:
        with open(args.json_file, "w") as f:
            json.dump(out, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
