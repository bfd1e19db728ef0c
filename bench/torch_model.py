#!/usr/bin/python3
"""The attnres model in PyTorch eager fp32, timed the way `attnres bench` times its own step.

A worker of `attnres bench` (which starts it with the same batch, shapes and thread count as its
own worker); also usable by hand. It computes the same function as src/model (and as the float64
oracle tests/reference/attnres_ref.py, written for clarity): decoder-only pre-norm Transformer with
RoPE, SwiGLU, tied or untied LM head, and the residual modes prenorm / full / block / rd
(value_route decoupled | tied | average | frozen), with the spec's depth read (RMS-normalised keys
times the key-norm weight, raw values, no 1/sqrt(d)).

Written as an efficient eager implementation, not as an oracle:
  * fp32, torch.set_num_threads(threads) and the OpenBLAS thread count set alike;
  * attention is matmul + additive causal mask + softmax + matmul (torch 1.13 has no
    scaled_dot_product_attention), with 1/sqrt(head_dim) folded into Q;
  * depth reads never stack their sources (that would save an O(n_sources) copy per read for the
    backward, the memory pitfall of spec §9): z_s = r_s * (v_s @ (w*gamma)) per source, the RMS
    factors r_s computed once per source and shared by every read, h = sum_s alpha_s v_s;
  * RD's two routes share r_s and gamma, as in the spec;
  * a full training step: zero_grad, forward, cross-entropy, backward, clip_grad_norm_(1.0),
    torch.optim.AdamW (decay on matrices only; foreach=True, the faster of torch's two paths here);
  * OMP_WAIT_POLICY=PASSIVE unless the environment sets it or --stock is given, as the attnres
    binary does for itself (src/cli/main.cpp), so that `attnres bench` runs both under the same
    setting (its workers inherit the binary's environment). Debian's torch runs its own ops on
    libgomp threads and its GEMMs on the pthread build of OpenBLAS (libblas.so.3); with libgomp's
    default active waiting its idle OpenMP threads spin on the cores the OpenBLAS threads need,
    which made a step 2-3x slower on the loaded 2-core benchmark machine (docs/performance.md).

Usage:
  /usr/bin/python3 bench/torch_model.py --model-json JSON --batch B --seq T [--steps N] [--warmup W]
      [--threads N] [--seed S] [--stock]
  /usr/bin/python3 bench/torch_model.py --probe [--stock]
Prints one JSON line on stdout (step times in ms, peak memory from VmHWM, OpenBLAS core name).
"""
import argparse
import ctypes
import ctypes.util
import json
import math
import os
import sys
import time


def _early_stock_flag():
    return "--stock" in sys.argv[1:]


# Must happen before torch (and with it libgomp) is loaded: libgomp reads it once.
if not _early_stock_flag() and "OMP_WAIT_POLICY" not in os.environ:
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def openblas():
    """The OpenBLAS that torch's BLAS calls go to (Debian: libblas.so.3 from openblas-pthread)."""
    for name in ("libopenblas.so.0", ctypes.util.find_library("openblas") or ""):
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)
            lib.openblas_get_corename.restype = ctypes.c_char_p
            return lib
        except OSError:
            continue
    return None


def vm_kb(key):
    """A value of /proc/self/status in kB (VmHWM: peak resident memory of this process image)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def param_shapes(cfg):
    V, d, Fh = cfg["vocab_size"], cfg["d_model"], cfg["mlp_hidden"]
    depth = cfg["residual"] != "prenorm"
    s = {"tok_emb.weight": (V, d)}
    for i in range(cfg["n_layers"]):
        p = f"layers.{i}."
        s[p + "attn_norm.weight"] = (d,)
        for w in ("wq", "wk", "wv", "wo"):
            s[p + f"attn.{w}.weight"] = (d, d)
        s[p + "mlp_norm.weight"] = (d,)
        s[p + "mlp.w_gate.weight"] = (Fh, d)
        s[p + "mlp.w_up.weight"] = (Fh, d)
        s[p + "mlp.w_down.weight"] = (d, Fh)
        if depth:
            s[p + "attn_res.query"] = (d,)
            s[p + "attn_res.key_norm.weight"] = (d,)
            if cfg["residual"] == "rd" and cfg["value_route"] in ("decoupled", "average"):
                s[p + "attn_res.value_query"] = (d,)
            s[p + "mlp_res.query"] = (d,)
            s[p + "mlp_res.key_norm.weight"] = (d,)
    if depth:
        s["final_res.query"] = (d,)
        s["final_res.key_norm.weight"] = (d,)
    s["final_norm.weight"] = (d,)
    if not cfg["tie_embeddings"]:
        s["lm_head.weight"] = (V, d)
    return s


def init_params(cfg, seed):
    """The project's initialisation scheme (docs/model.md), not its exact values: matrices N(0, 0.02),
    wo and w_down N(0, 0.02/sqrt(2*n_layers)), norm weights 1, pseudo-queries 0."""
    g = torch.Generator().manual_seed(seed)
    P = {}
    for name, shape in param_shapes(cfg).items():
        if len(shape) == 2:
            std = 0.02 / math.sqrt(2 * cfg["n_layers"]) if name.endswith(("wo.weight", "w_down.weight")) else 0.02
            t = torch.randn(shape, generator=g, dtype=torch.float32) * std
        elif name.endswith("query"):
            t = torch.zeros(shape, dtype=torch.float32)
        else:
            t = torch.ones(shape, dtype=torch.float32)
        P[name] = torch.nn.Parameter(t)
    return P


class Model:
    def __init__(self, cfg, P, seq):
        self.cfg, self.P = cfg, P
        d, H = cfg["d_model"], cfg["n_heads"]
        hd = d // H
        self.eps = cfg["norm_eps"]
        inv_freq = cfg["rope_theta"] ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
        ang = torch.arange(seq, dtype=torch.float64)[:, None] * inv_freq[None, :]
        self.cos = torch.cat([ang.cos(), ang.cos()], -1).float()  # [T, hd]
        self.sin = torch.cat([ang.sin(), ang.sin()], -1).float()
        self.mask = torch.full((seq, seq), float("-inf")).triu(1)  # additive causal mask
        self.scale = 1.0 / math.sqrt(hd)

    def rms_norm(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w

    def rope(self, x):  # x: [B, H, T, hd]
        h = x.shape[-1] // 2
        return x * self.cos + torch.cat([-x[..., h:], x[..., :h]], -1) * self.sin

    def attention(self, p, x_qk, x_v):
        P, B, T, d = self.P, *x_qk.shape
        H = self.cfg["n_heads"]
        hd = d // H

        def heads(t):
            return t.view(B, T, H, hd).transpose(1, 2)

        q = self.rope(heads(F.linear(x_qk, P[p + "attn.wq.weight"] * self.scale)))
        k = self.rope(heads(F.linear(x_qk, P[p + "attn.wk.weight"])))
        v = heads(F.linear(x_v, P[p + "attn.wv.weight"]))
        s = torch.matmul(q, k.transpose(-1, -2)) + self.mask
        o = torch.matmul(torch.softmax(s, dim=-1), v)
        return F.linear(o.transpose(1, 2).reshape(B, T, d), P[p + "attn.wo.weight"])

    def mlp(self, p, x):
        P = self.P
        return F.linear(F.silu(F.linear(x, P[p + "mlp.w_gate.weight"])) * F.linear(x, P[p + "mlp.w_up.weight"]),
                        P[p + "mlp.w_down.weight"])

    @staticmethod
    def mix(alpha, sources):
        h = alpha[..., 0:1] * sources[0]
        for s in range(1, len(sources)):
            h = h + alpha[..., s:s + 1] * sources[s]
        return h

    def depth_read(self, sources, rms, queries, gamma):
        """One read with one or two routes over the same sources (RMS factors and gamma shared).
        queries: list of pseudo-queries, None for a uniform route. Returns one output per route."""
        outs = []
        for w in queries:
            if w is None:
                alpha = torch.full(sources[0].shape[:-1] + (len(sources),), 1.0 / len(sources))
            elif len(sources) == 1:
                outs.append(sources[0])
                continue
            else:
                u = w * gamma
                z = torch.stack([r * torch.matmul(v, u) for v, r in zip(sources, rms)], -1)  # [B, T, n]
                alpha = torch.softmax(z, dim=-1)
            outs.append(self.mix(alpha, sources))
        return outs

    def forward(self, inputs):
        cfg, P, eps = self.cfg, self.P, self.eps
        emb = F.embedding(inputs, P["tok_emb.weight"])
        L = 2 * cfg["n_layers"]
        if cfg["residual"] == "prenorm":
            x = emb
            for k in range(cfg["n_layers"]):
                p = f"layers.{k}."
                a = self.rms_norm(x, P[p + "attn_norm.weight"])
                x = x + self.attention(p, a, a)
                x = x + self.mlp(p, self.rms_norm(x, P[p + "mlp_norm.weight"]))
        else:
            S = 1 if cfg["residual"] == "full" else L // cfg["n_blocks"]

            def rms_of(v):  # [B, T]: computed once per source, shared by every read of it
                return torch.rsqrt(v.pow(2).mean(-1) + eps)

            blocks, block_rms, partial = [emb], [rms_of(emb)], None
            route = cfg["value_route"] if cfg["residual"] == "rd" else "tied"
            for j in range(L):
                k, is_mlp = divmod(j, 2)
                p = f"layers.{k}."
                if j % S == 0 and j > 0:
                    blocks.append(partial)
                    block_rms.append(rms_of(partial))
                    partial = None
                sources, rms = list(blocks), list(block_rms)
                if partial is not None:
                    sources.append(partial)
                    rms.append(rms_of(partial))
                if is_mlp:
                    (h,) = self.depth_read(sources, rms, [P[p + "mlp_res.query"]], P[p + "mlp_res.key_norm.weight"])
                    out = self.mlp(p, self.rms_norm(h, P[p + "mlp_norm.weight"]))
                else:
                    gamma, nw = P[p + "attn_res.key_norm.weight"], P[p + "attn_norm.weight"]
                    q = P[p + "attn_res.query"]
                    if route == "tied":
                        (h,) = self.depth_read(sources, rms, [q], gamma)
                        x_qk = x_v = self.rms_norm(h, nw)
                    elif route == "frozen":
                        h, hv = self.depth_read(sources, rms, [q, None], gamma)
                        x_qk, x_v = self.rms_norm(h, nw), self.rms_norm(hv, nw)
                    else:
                        h, hv = self.depth_read(sources, rms, [q, P[p + "attn_res.value_query"]], gamma)
                        if route == "average":
                            x_qk = x_v = self.rms_norm(0.5 * (h + hv), nw)
                        else:
                            x_qk, x_v = self.rms_norm(h, nw), self.rms_norm(hv, nw)
                    out = self.attention(p, x_qk, x_v)
                partial = out if partial is None else partial + out
            blocks.append(partial)
            block_rms.append(rms_of(partial))
            (x,) = self.depth_read(blocks, block_rms, [P["final_res.query"]], P["final_res.key_norm.weight"])
        x = self.rms_norm(x, P["final_norm.weight"])
        head = P["tok_emb.weight"] if cfg["tie_embeddings"] else P["lm_head.weight"]
        return F.linear(x, head)


def run(args):
    cfg = json.loads(args.model_json)
    if cfg["residual"] == "full":
        cfg["n_blocks"] = 2 * cfg["n_layers"]
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    blas = openblas()
    if blas is not None:
        blas.openblas_set_num_threads(args.threads)
    rss_start = vm_kb("VmRSS") * 1024

    P = init_params(cfg, args.seed)
    model = Model(cfg, P, args.seq)
    decay = [t for t in P.values() if t.dim() == 2]
    no_decay = [t for t in P.values() if t.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8, foreach=args.foreach)
    params = list(P.values())
    g = torch.Generator().manual_seed(args.seed + 1)
    V, B, T = cfg["vocab_size"], args.batch, args.seq

    step_ms, cpu_ms, losses = [], [], []
    for step in range(args.warmup + args.steps):
        tokens = torch.randint(0, V, (B, T + 1), generator=g)
        inputs, targets = tokens[:, :-1], tokens[:, 1:].reshape(-1)
        t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad(set_to_none=True)
        logits = model.forward(inputs)
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
        "step_ms": step_ms, "cpu_ms": cpu_ms, "loss_first": losses[0], "loss_last": losses[-1],
        "params": sum(t.numel() for t in params), "peak_rss_bytes": vm_kb("VmHWM") * 1024,
        "start_rss_bytes": rss_start, "optimizer": f"torch.optim.AdamW(foreach={args.foreach})",
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "unset"),
    }), flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--probe", action="store_true", help="print torch's version and OpenBLAS core, then exit")
    ap.add_argument("--model-json", help="the model config as JSON (as in a checkpoint's metadata)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--foreach", type=int, choices=(0, 1), default=1, help="AdamW multi-tensor path")
    ap.add_argument("--stock", action="store_true",
                    help="leave OMP_WAIT_POLICY as the environment has it (libgomp default: active waiting)")
    args = ap.parse_args(argv)
    if args.probe:
        blas = openblas()
        core = blas.openblas_get_corename().decode() if blas is not None else "unknown"
        print(json.dumps({"torch_version": torch.__version__, "openblas_core": core,
                          "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "unset")}), flush=True)
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
