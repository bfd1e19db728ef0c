"""The PyTorch worker of `attnres bench`: full training steps of attnres.model.AttnResModel, timed the
way the benchmark times its own step (bench/torch_model.py runs this from python/ without installing).

  * fp32 weights, torch.set_num_threads(threads) and the OpenBLAS thread count set alike;
  * --precision fp32 (default), or bf16: torch.autocast("cpu", dtype=torch.bfloat16) around the
    forward and the loss, as a PyTorch user would run bf16 on a CPU (weights, gradients and the
    optimizer stay fp32);
  * a step is zero_grad, forward, cross-entropy, backward, clip_grad_norm_(1.0) and
    torch.optim.AdamW (decay where attnres decays: matrices, and DenseFormer's DWA weights when
    dwa_weight_decay; foreach=True, the faster of torch's two paths here);
  * every residual mode of the package and the value residual: `attnres bench --arms` passes the
    arm's model config (denseformer, denseformer-4x5, any arm+vres) as --model-json;
  * OMP_WAIT_POLICY=PASSIVE unless the environment sets it or --stock is given, as the attnres
    binary does for itself (src/cli/main.cpp), so that `attnres bench` runs both under the same
    setting (its workers inherit the binary's environment). Debian's torch runs its own ops on
    libgomp threads and its GEMMs on the pthread build of OpenBLAS (libblas.so.3); with libgomp's
    default active waiting its idle OpenMP threads spin on the cores the OpenBLAS threads need,
    which made a step 2-3x slower on the loaded 2-core benchmark machine (docs/performance.md).
    This module sets it before importing torch, so import it before anything imports torch.
  * --matmul-rate: no model; the rate of torch.matmul on bf16 (or fp32) tensors, C = A B^T as a
    Linear computes it, best of --reps calls after one warm-up, on each --shapes MxNxK. `attnres
    bench` takes the better of this and its own bf16 GEMM as the reference rate for the MFU of
    bf16 runs (docs/performance.md).

Usage:
  python3 -m attnres.bench_worker --model-json JSON --batch B --seq T [--steps N] [--warmup W]
      [--threads N] [--seed S] [--precision fp32|bf16] [--stock]
  python3 -m attnres.bench_worker --probe [--stock]
  python3 -m attnres.bench_worker --matmul-rate --shapes 2048x2048x2048,4096x1280x256 [--dtype bf16|fp32]
      [--reps N] [--threads N] [--stock]
Prints one JSON line on stdout (step times in ms, peak memory from VmHWM, OpenBLAS core name).
"""
import argparse
import ctypes
import ctypes.util
import json
import os
import sys
import time

# Must happen before torch (and with it libgomp) is loaded: libgomp reads it once.
if "--stock" not in sys.argv[1:] and "OMP_WAIT_POLICY" not in os.environ:
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from .config import ModelConfig  # noqa: E402
from .model import MODES, AttnResModel, weight_decayed  # noqa: E402

PRECISIONS = ("fp32", "bf16")


def openblas():
    """The OpenBLAS that torch's BLAS calls go to (Debian: libblas.so.3 from openblas-pthread)."""
    for name in ("libopenblas.so.0", ctypes.util.find_library("openblas") or ""):
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)
            lib.openblas_get_corename.restype = ctypes.c_char_p
            return lib
        except (OSError, AttributeError):
            continue
    return None


def vm_kb(key):
    """A value of /proc/self/status in kB (VmHWM: peak resident memory of this process image)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def set_threads(threads):
    """torch's intra-op threads and, when torch's BLAS is OpenBLAS, its thread count too."""
    torch.set_num_threads(threads)
    blas = openblas()
    if blas is not None:
        blas.openblas_set_num_threads(threads)
    return blas


def parse_shape(text):
    """'MxNxK' -> (m, n, k), each positive."""
    parts = text.split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"--shapes: '{text}' is not MxNxK with positive integers")
    return tuple(int(p) for p in parts)


def matmul_rate(m, n, k, dtype, reps):
    """GFLOP/s of torch.matmul(A, B.t()) with A [m, k], B [n, k] of `dtype`: best of `reps` calls
    after one untimed warm-up (a Linear's forward, as F.linear runs it under autocast)."""
    g = torch.Generator().manual_seed(7)
    a = (torch.rand(m, k, generator=g) - 0.5).to(dtype)
    b = (torch.rand(n, k, generator=g) - 0.5).to(dtype)
    best = float("inf")
    with torch.no_grad():
        for r in range(reps + 1):
            t0 = time.perf_counter()
            torch.matmul(a, b.t())
            seconds = time.perf_counter() - t0
            if r > 0:
                best = min(best, seconds)
    return 2.0 * m * n * k / best / 1e9


def run_matmul_rates(args):
    set_threads(args.threads)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    rates = []
    for m, n, k in args.shapes:
        rates.append({"m": m, "n": n, "k": k, "gflops": matmul_rate(m, n, k, dtype, args.reps)})
    print(json.dumps({"impl": "torch", "torch_version": torch.__version__, "dtype": args.dtype,
                      "op": f"torch.matmul on {args.dtype} tensors, A B^T", "threads": torch.get_num_threads(),
                      "mkldnn": torch.backends.mkldnn.is_available(), "reps": args.reps, "matmul": rates}),
          flush=True)


def optimizer(model, foreach=True, fused=False):
    """torch.optim.AdamW with attnres's decay groups: [decayed (weight_decay 0.1), the rest (0)];
    fused: torch's fused kernel (CUDA; scripts/torch_peer.py), instead of foreach."""
    named = list(model.named_parameters())
    decay = [t for n, t in named if weight_decayed(model.config, n, tuple(t.shape))]
    no_decay = [t for n, t in named if not weight_decayed(model.config, n, tuple(t.shape))]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                             lr=1e-3, betas=(0.9, 0.95), eps=1e-8,
                             **({"fused": True} if fused else {"foreach": foreach}))


def run(args):
    cfg = ModelConfig.from_json(args.model_json, where="--model-json")
    if args.seq > cfg.max_seq_len:
        cfg = cfg.replace(max_seq_len=args.seq)
    torch.manual_seed(args.seed)
    blas = set_threads(args.threads)
    rss_start = vm_kb("VmRSS") * 1024

    model = AttnResModel(cfg, seed=args.seed)
    params = list(model.parameters())
    opt = optimizer(model, args.foreach)
    g = torch.Generator().manual_seed(args.seed + 1)
    V, B, T = cfg.vocab_size, args.batch, args.seq
    bf16 = args.precision == "bf16"

    step_ms, cpu_ms, losses = [], [], []
    for step in range(args.warmup + args.steps):
        tokens = torch.randint(0, V, (B, T + 1), generator=g)
        inputs, targets = tokens[:, :-1], tokens[:, 1:].reshape(-1)
        t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(inputs)
            loss = F.cross_entropy(logits.view(-1, V), targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        loss_value = loss.item()
        t1, c1 = time.perf_counter(), time.process_time()
        losses.append(loss_value)
        if step >= args.warmup:
            step_ms.append((t1 - t0) * 1e3)
            cpu_ms.append((c1 - c0) * 1e3)
        del logits, loss

    core = blas.openblas_get_corename().decode() if blas is not None else "unknown"
    print(json.dumps({
        "impl": "torch", "torch_version": torch.__version__, "openblas_core": core,
        "threads": torch.get_num_threads(), "batch": B, "seq": T, "warmup": args.warmup,
        "precision": args.precision,
        "step_ms": step_ms, "cpu_ms": cpu_ms, "loss_first": losses[0], "loss_last": losses[-1],
        "params": sum(t.numel() for t in params), "peak_rss_bytes": vm_kb("VmHWM") * 1024,
        "start_rss_bytes": rss_start, "optimizer": f"torch.optim.AdamW(foreach={args.foreach})",
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "unset"),
    }), flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--probe", action="store_true", help="print torch's version and OpenBLAS core, then exit")
    ap.add_argument("--matmul-rate", action="store_true",
                    help="print the GFLOP/s of torch.matmul on --shapes (no model), then exit")
    ap.add_argument("--shapes", default="2048x2048x2048",
                    help="with --matmul-rate: comma-separated MxNxK, C[m,n] = A[m,k] B[n,k]^T")
    ap.add_argument("--dtype", choices=PRECISIONS, default="bf16", help="with --matmul-rate: the tensors' type")
    ap.add_argument("--reps", type=int, default=3, help="with --matmul-rate: timed calls per shape (best counts)")
    ap.add_argument("--model-json", help="the model config as JSON (as in a checkpoint's metadata)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--precision", choices=PRECISIONS, default="fp32",
                    help="fp32, or bf16: torch.autocast('cpu', dtype=torch.bfloat16) around forward and loss")
    ap.add_argument("--foreach", type=int, choices=(0, 1), default=1, help="AdamW multi-tensor path")
    ap.add_argument("--stock", action="store_true",
                    help="leave OMP_WAIT_POLICY as the environment has it (libgomp default: active waiting)")
    args = ap.parse_args(argv)
    if args.probe:
        blas = openblas()
        core = blas.openblas_get_corename().decode() if blas is not None else "unknown"
        print(json.dumps({"torch_version": torch.__version__, "openblas_core": core,
                          "precisions": list(PRECISIONS), "mkldnn": torch.backends.mkldnn.is_available(),
                          "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "unset"),
                          "residuals": list(MODES)}), flush=True)
        return 0
    if args.matmul_rate:
        try:
            args.shapes = [parse_shape(s) for s in args.shapes.split(",")]
        except ValueError as e:
            ap.error(str(e))
        if args.reps < 1 or args.threads < 1:
            ap.error("--reps and --threads must be positive")
        run_matmul_rates(args)
        return 0
    if not args.model_json:
        ap.error("--model-json is required")
    if args.batch < 1 or args.seq < 1 or args.steps < 1 or args.warmup < 0 or args.threads < 1:
        ap.error("--batch, --seq, --steps and --threads must be positive, --warmup non-negative")
    args.foreach = bool(args.foreach)
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
