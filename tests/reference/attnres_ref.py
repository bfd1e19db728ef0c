#!/usr/bin/python3
"""Independent float64 PyTorch reference for attnres (see /work/shared/docs/attnres-spec.md).

Test oracle: clarity over speed. Every gradient comes from torch autograd; all math is float64 on CPU.

Residual modes: "prenorm" (standard pre-norm Transformer), "full" (Full AttnRes, n_blocks = 2*n_layers),
"block" (Block AttnRes), "rd" (RD-AttnRes; value_route = decoupled | tied | average | frozen), "denseformer"
(DenseFormer, /work/shared/docs/baselines-spec.md §1: a DWA after every dwa_period-th block over every
dwa_dilation-th block output), "hc" (Hyper-Connections, baselines-spec §3: hc_n streams, static or dynamic,
tanh on or off) and "mhc" (mHC, §4: mhc_n streams, Sinkhorn of mhc_sinkhorn_iters in either order); both
enter with the embedding copied to every stream and leave with the sum (or mean) of the streams. Option value_residual (ResFormer, baselines-spec §5, any mode): attention layers
after the first use V' = lambda1 V_1 + lambda2 V_n; vres_mode = fixed | learned_convex | learned_pair | constant.
"delta" and "delta_block" (Delta AttnRes, docs/delta-gated-spec.md §1: the pre-norm
stream plus a softmax-weighted correction over earlier sublayer outputs or block sums) and "gr" (the Gated Residual
of Qwen3.8-Flash-Next, §2: n branches, a gated mean as each sublayer's input, per-branch gated writes).
"mudd" (MUDDFormer, baselines-spec §2): after every block a DA module mixes the block outputs X_0..X_{i+1} into
the next block's Q, K, V and residual inputs (mudd_ways = qkvr) or its single input (r), with per-token weights
from a generator (mudd_dynamic) or static ones; mudd_prepost_norm: PrePostDANorm (§2.2).

Command line (used by the C++ tests):
  /usr/bin/python3 tests/reference/attnres_ref.py --weights W.safetensors --tokens TOK.safetensors
      --out OUT.safetensors [--adamw-steps N --lr LR --weight-decay WD --clip C --warmup W
      --min-lr-ratio R --schedule cosine|wsd --decay-fraction F --total-steps S]
  W:   every parameter (F32 or F64), metadata "config" = JSON string of the model config.
  TOK: tensor "tokens", I32 or I64, shape [B, T+1]; inputs = tokens[:, :T], targets = tokens[:, 1:].
  OUT (all F64): "logits" [B,T,V], "loss" [] and "grad.<name>" for every parameter, at the given weights;
       with --adamw-steps N also "losses" [N] (loss before each update) and "param.<name>" (after N updates,
       the same batch every step); with --rounding-trials N also "rounding.<key>" for each of those (the
       element-wise float32 rounding sensitivity, tests/reference/rounding.py).

Optimiser (one update s = 0..N-1; lr_max = --lr):
  learning rate
    if s < warmup:         lr = lr_max * (s + 1) / warmup
    else, floor = min_lr_ratio * lr_max:
      cosine:  p = (s - warmup) / max(1, total_steps - warmup)
               lr = floor + (lr_max - floor) * 0.5 * (1 + cos(pi * p))
      wsd:     decay_start = total_steps - floor(decay_fraction * total_steps + 0.5)   (round half up)
               if s < decay_start: lr = lr_max
               else: frac = (s - decay_start) / max(1, total_steps - decay_start)
                     lr = lr_max + (floor - lr_max) * frac
  gradient clipping over all parameters (torch.nn.utils.clip_grad_norm_), only when clip > 0:
    total = sqrt(sum over all parameters and elements of g^2); coef = clip / (total + 1e-6)
    if coef < 1: g = g * coef
  AdamW (torch.optim.AdamW, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, t = s + 1, m = v = 0 at t = 0):
    p = p * (1 - lr * wd)          only for 2-D parameters (all weight matrices incl. tok_emb, lm_head) and
                                   DenseFormer's dwa.*.alpha when dwa_weight_decay (the official code's
                                   policy), HC's hc.*.w_alpha and hc.*.w_beta and mHC's mhc.*.phi (but
                                   not hc.*.A, the HC and mHC scalars and biases), MUDD's mudd.*.w1 and
                                   mudd.*.w2 and, when mudd_decay_all (the official code's policy), every
                                   other mudd.* parameter (a, the PrePostDANorm norms); Delta AttnRes's
                                   read parameters (attn_res.*, mlp_res.*: queries, key norms, null sources,
                                   gates) when delta_decay_all (the released code's policy), else only its
                                   vector gates' matrices; GR's gr.*.w_down, w_up, w_inject (and its
                                   zero-centred norm weights when gr_decay_norm); never for the other
                                   norm weights (MUDD's attention K/V norms included), key-norm weights,
                                   pseudo-queries or the value-residual lambdas
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    p = p - (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
Defaults: lr 1e-3, weight-decay 0, clip 0 (off), warmup 0, min-lr-ratio 0, schedule cosine,
decay-fraction 0.2, total-steps = N.
"""
import argparse
import json
import math
import struct
import sys

import numpy as np
import torch

torch.set_default_dtype(torch.float64)
torch.use_deterministic_algorithms(True)
torch.backends.cuda.matmul.allow_tf32 = False  # irrelevant on CPU; keep the reference exact anywhere
torch.backends.cudnn.allow_tf32 = False

RESIDUALS = ("prenorm", "full", "block", "rd", "denseformer", "hc", "mhc", "mudd", "delta", "delta_block", "gr")
DELTA_MODES = ("delta", "delta_block")
DELTA_GATES = ("none", "sigmoid_scalar", "sigmoid_vector", "learnable_alpha")
DELTA_VALUE_ROUTES = ("none", "decoupled")
STREAM_READOUTS = ("sum", "mean")
SINKHORN_ORDERS = ("col_row", "row_col")
MHC_BIAS_INITS = ("home_pm3", "zero")
MUDD_WAYS = ("qkvr", "r")
GELUS = ("erf", "tanh")
VALUE_ROUTES = ("decoupled", "tied", "average", "frozen")
VRES_MODES = ("fixed", "learned_convex", "learned_pair", "constant")
VRES_PARAMS = {"fixed": 0, "learned_convex": 1, "learned_pair": 2, "constant": 0}

# ----------------------------------------------------------------------------------------------------------
# safetensors (minimal reader/writer: json + numpy)
# ----------------------------------------------------------------------------------------------------------
_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
           "U8": "u1", "BOOL": "?"}
_NP_TO_ST = {np.dtype("<f8"): "F64", np.dtype("<f4"): "F32", np.dtype("<i8"): "I64", np.dtype("<i4"): "I32"}


def load_safetensors(path):
    """Returns ({name: np.ndarray}, {metadata str: str})."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = blob[8 + n:]
    meta = header.pop("__metadata__", None) or {}
    out = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        raw = data[begin:end]
        if info["dtype"] == "BF16":
            arr = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            arr = np.frombuffer(raw, dtype=_DTYPES[info["dtype"]])
        if arr.size != int(np.prod(shape)):
            raise ValueError(f"{path}: tensor {name}: {arr.size} elements for shape {list(shape)}")
        out[name] = arr.reshape(shape).copy()
    return out, meta


def save_safetensors(path, tensors, metadata=None):
    """tensors: {name: np.ndarray | torch.Tensor} of float64/float32/int64/int32."""
    header, chunks, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, t in tensors.items():
        a = t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
        a = np.asarray(a, dtype=a.dtype.newbyteorder("<"))  # (not ascontiguousarray: it turns 0-d into 1-d)
        b = a.tobytes(order="C")
        header[name] = {"dtype": _NP_TO_ST[a.dtype], "shape": list(a.shape), "data_offsets": [offset, offset + len(b)]}
        chunks.append(b)
        offset += len(b)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in chunks:
            f.write(b)


# ----------------------------------------------------------------------------------------------------------
# config and parameters
# ----------------------------------------------------------------------------------------------------------
def _as_bool(v):
    if isinstance(v, str):
        if v.lower() in ("true", "1"):
            return True
        if v.lower() in ("false", "0"):
            return False
        raise ValueError(f"not a bool: {v!r}")
    return bool(v)


def parse_config(c):
    """Normalises a config dict (or JSON string). Raises on bad or inconsistent values."""
    if isinstance(c, str):
        c = json.loads(c)
    cfg = {
        "vocab_size": int(c["vocab_size"]), "d_model": int(c["d_model"]), "n_layers": int(c["n_layers"]),
        "n_heads": int(c["n_heads"]), "mlp_hidden": int(c["mlp_hidden"]), "residual": str(c["residual"]),
        "value_route": str(c.get("value_route", "decoupled")), "tie_embeddings": _as_bool(c["tie_embeddings"]),
        "norm_eps": float(c["norm_eps"]), "rope_theta": float(c["rope_theta"]),
        "max_seq_len": int(c["max_seq_len"]) if "max_seq_len" in c else None,
        "dwa_dilation": int(c.get("dwa_dilation", 1)), "dwa_period": int(c.get("dwa_period", 1)),
        "dwa_weight_decay": _as_bool(c.get("dwa_weight_decay", True)),
        "value_residual": _as_bool(c.get("value_residual", False)), "vres_mode": str(c.get("vres_mode", "fixed")),
        "vres_lambda1": float(c.get("vres_lambda1", 0.5)), "vres_lambda2": float(c.get("vres_lambda2", 0.5)),
        "hc_n": int(c.get("hc_n", 4)), "hc_dynamic": _as_bool(c.get("hc_dynamic", True)),
        "hc_tanh": _as_bool(c.get("hc_tanh", True)), "hc_reduce": str(c.get("hc_reduce", "sum")),
        "mhc_n": int(c.get("mhc_n", 4)), "mhc_sinkhorn_iters": int(c.get("mhc_sinkhorn_iters", 20)),
        "mhc_sinkhorn_order": str(c.get("mhc_sinkhorn_order", "col_row")),
        "mhc_pre_eps": float(c.get("mhc_pre_eps", 0.0)), "mhc_reduce": str(c.get("mhc_reduce", "sum")),
        "mudd_ways": str(c.get("mudd_ways", "qkvr")), "mudd_dynamic": _as_bool(c.get("mudd_dynamic", True)),
        "mudd_hidden_round": int(c.get("mudd_hidden_round", 64)),
        "mudd_last_expand": int(c.get("mudd_last_expand", 4)), "mudd_gelu": str(c.get("mudd_gelu", "erf")),
        "mudd_sep_qkv_norm": _as_bool(c.get("mudd_sep_qkv_norm", True)),
        "mudd_prepost_norm": _as_bool(c.get("mudd_prepost_norm", False)),
        "mudd_decay_all": _as_bool(c.get("mudd_decay_all", True)),
        "delta_null_source": _as_bool(c.get("delta_null_source", False)),
        "delta_gate": str(c.get("delta_gate", "none")),
        "delta_value_route": str(c.get("delta_value_route", "none")),
        "delta_block_partial": _as_bool(c.get("delta_block_partial", True)),
        "delta_decay_all": _as_bool(c.get("delta_decay_all", True)),
        "gr_n": int(c.get("gr_n", 4)), "gr_rank": int(c.get("gr_rank", 0)),
        "gr_decay_norm": _as_bool(c.get("gr_decay_norm", False)),
    }
    if cfg["delta_gate"] not in DELTA_GATES:
        raise ValueError(f"unknown delta_gate {cfg['delta_gate']!r}; expected one of {DELTA_GATES}")
    if cfg["delta_value_route"] not in DELTA_VALUE_ROUTES:
        raise ValueError(f"unknown delta_value_route {cfg['delta_value_route']!r}; expected one of {DELTA_VALUE_ROUTES}")
    if not 2 <= cfg["gr_n"] <= 8 or cfg["gr_rank"] < 0:
        raise ValueError("gr_n must be 2 to 8 and gr_rank >= 0")
    if not (1 <= cfg["hc_n"] <= 8 and 1 <= cfg["mhc_n"] <= 8):
        raise ValueError("hc_n and mhc_n must be 1 to 8")
    if cfg["mhc_sinkhorn_iters"] < 1:
        raise ValueError("mhc_sinkhorn_iters must be >= 1")
    if cfg["hc_reduce"] not in STREAM_READOUTS or cfg["mhc_reduce"] not in STREAM_READOUTS:
        raise ValueError(f"hc_reduce and mhc_reduce must be one of {STREAM_READOUTS}")
    if cfg["mhc_sinkhorn_order"] not in SINKHORN_ORDERS:
        raise ValueError(f"mhc_sinkhorn_order must be one of {SINKHORN_ORDERS}")
    if cfg["mudd_ways"] not in MUDD_WAYS:
        raise ValueError(f"unknown mudd_ways {cfg['mudd_ways']!r}; expected one of {MUDD_WAYS}")
    if cfg["mudd_gelu"] not in GELUS:
        raise ValueError(f"unknown mudd_gelu {cfg['mudd_gelu']!r}; expected one of {GELUS}")
    if cfg["mudd_hidden_round"] < 0 or cfg["mudd_last_expand"] < 1:
        raise ValueError("mudd_hidden_round must be >= 0 and mudd_last_expand >= 1")
    if cfg["vres_mode"] not in VRES_MODES:
        raise ValueError(f"unknown vres_mode {cfg['vres_mode']!r}; expected one of {VRES_MODES}")
    if cfg["dwa_dilation"] < 1 or cfg["dwa_period"] < 1:
        raise ValueError("dwa_dilation and dwa_period must be >= 1")
    if cfg["residual"] not in RESIDUALS:
        raise ValueError(f"unknown residual {cfg['residual']!r}; expected one of {RESIDUALS}")
    if cfg["value_route"] not in VALUE_ROUTES:
        raise ValueError(f"unknown value_route {cfg['value_route']!r}; expected one of {VALUE_ROUTES}")
    d, H, L = cfg["d_model"], cfg["n_heads"], 2 * cfg["n_layers"]
    if d % H != 0 or (d // H) % 2 != 0:
        raise ValueError(f"d_model {d} must split into {H} heads of even size")
    if cfg["residual"] in ("full", "delta"):
        cfg["n_blocks"] = L
    elif cfg["residual"] in ("block", "rd", "delta_block"):
        N = int(c["n_blocks"])
        if N <= 0 or L % N != 0 or ((L // N) % 2 != 0 and N != L):
            raise ValueError(f"n_blocks {N} must divide {L} sublayers into blocks of an even size (or equal {L})")
        cfg["n_blocks"] = N
    else:
        cfg["n_blocks"] = int(c.get("n_blocks", 0))
    return cfg


def gr_rank(cfg):
    """The Gated Residual read gate's bottleneck width: gr_rank, or d / 8 (at least 1) when 0."""
    return cfg["gr_rank"] if cfg["gr_rank"] > 0 else max(1, cfg["d_model"] // 8)


def delta_read_params(cfg, read, value_route=False):
    """{suffix: shape} of one Delta AttnRes read (attn_res or mlp_res), in ParamLayout order
    (docs/delta-gated-spec.md §1.7)."""
    d = cfg["d_model"]
    s = {read + ".query": (d,), read + ".key_norm.weight": (d,)}
    if value_route:
        s[read + ".value_query"] = (d,)
        s[read + ".value_key_norm.weight"] = (d,)
    if cfg["delta_null_source"]:
        s[read + ".null_source"] = (d,)
    gate = cfg["delta_gate"]
    if gate == "sigmoid_scalar":
        s[read + ".gate_logit"] = (1,)
    elif gate == "learnable_alpha":
        s[read + ".gate_alpha"] = (1,)
    elif gate == "sigmoid_vector":
        s[read + ".gate.weight"] = (d, d)
        s[read + ".gate.bias"] = (d,)
    return s


def mudd_da_shape(cfg, i):
    """(C, S, K) of MUDD's DA module i (after block i, 0-based): ways, sources X_0..X_{i+1}, generator width."""
    last = i == cfg["n_layers"] - 1
    C = 1 if last or cfg["mudd_ways"] == "r" else 4
    S = i + 2
    return C, S, mudd_hidden_width(C, S, cfg["mudd_last_expand"] if last else 1, cfg["mudd_hidden_round"])


def mudd_multiway(cfg):
    return cfg["residual"] == "mudd" and cfg["mudd_ways"] == "qkvr"


def param_shapes(cfg):
    """The exact parameter set {name: shape} for a config."""
    V, d, F = cfg["vocab_size"], cfg["d_model"], cfg["mlp_hidden"]
    depth = cfg["residual"] in ("full", "block", "rd")
    n_vres = VRES_PARAMS[cfg["vres_mode"]] if cfg["value_residual"] else 0
    s = {"tok_emb.weight": (V, d)}
    for i in range(cfg["n_layers"]):
        p = f"layers.{i}."
        if cfg["residual"] != "gr":  # GR's read replaces the pre-norms
            s[p + "attn_norm.weight"] = (d,)
        if mudd_multiway(cfg) and cfg["mudd_sep_qkv_norm"]:
            s[p + "attn_norm_k.weight"] = (d,)
            s[p + "attn_norm_v.weight"] = (d,)
        for w in ("wq", "wk", "wv", "wo"):
            s[p + f"attn.{w}.weight"] = (d, d)
        if i >= 1 and n_vres > 0:
            s[p + "attn.vres_lambda"] = (n_vres,)
        if cfg["residual"] != "gr":
            s[p + "mlp_norm.weight"] = (d,)
        s[p + "mlp.w_gate.weight"] = (F, d)
        s[p + "mlp.w_up.weight"] = (F, d)
        s[p + "mlp.w_down.weight"] = (d, F)
        if depth:
            s[p + "attn_res.query"] = (d,)
            s[p + "attn_res.key_norm.weight"] = (d,)
            if cfg["residual"] == "rd" and cfg["value_route"] in ("decoupled", "average"):
                s[p + "attn_res.value_query"] = (d,)
            s[p + "mlp_res.query"] = (d,)
            s[p + "mlp_res.key_norm.weight"] = (d,)
        if cfg["residual"] in DELTA_MODES:
            decoupled = cfg["delta_value_route"] == "decoupled"
            s.update({p + n: shape for n, shape in delta_read_params(cfg, "attn_res", decoupled).items()})
            s.update({p + n: shape for n, shape in delta_read_params(cfg, "mlp_res").items()})
    if cfg["residual"] == "denseformer":
        for i in range(1, cfg["n_layers"] + 1):
            n = len(dwa_sources(i, cfg["dwa_dilation"], cfg["dwa_period"]))
            if n > 0:
                s[f"dwa.{i}.alpha"] = (n,)
    for j in range(2 * cfg["n_layers"]):  # one stream module per sublayer (spec §6.6)
        if cfg["residual"] == "hc":
            n = cfg["hc_n"]
            s[f"hc.{j}.A"] = (n, n + 1)
            s[f"hc.{j}.B"] = (n,)
            if cfg["hc_dynamic"]:
                s[f"hc.{j}.w_alpha"] = (n + 1, d)
                s[f"hc.{j}.w_beta"] = (d,)
                s[f"hc.{j}.s_alpha"] = (1,)
                s[f"hc.{j}.s_beta"] = (1,)
                s[f"hc.{j}.norm.weight"] = (d,)
        elif cfg["residual"] == "mhc":
            n = cfg["mhc_n"]
            s[f"mhc.{j}.phi"] = (n * (n + 2), n * d)
            s[f"mhc.{j}.alpha"] = (3,)
            s[f"mhc.{j}.b"] = (n * (n + 2),)
    if cfg["residual"] == "mudd":
        prepost = cfg["mudd_prepost_norm"]
        for i in range(cfg["n_layers"]):
            C, S, K = mudd_da_shape(cfg, i)
            if cfg["mudd_dynamic"]:
                s[f"mudd.{i}.w1"] = (K, d)
                s[f"mudd.{i}.w2"] = (C * S, K)
            s[f"mudd.{i}.a"] = (C, S)
            if prepost and cfg["mudd_dynamic"]:
                s[f"mudd.{i}.gen_norm.weight"] = (d,)
            if prepost:
                s[f"mudd.{i}.post_norm.weight"] = (d,)
        if prepost:
            for j in range(cfg["n_layers"] + 1):
                s[f"mudd.src_norm.{j}.weight"] = (d,)
    if cfg["residual"] == "gr":  # one module per sublayer, then the final mixer (no final norm)
        n, r = cfg["gr_n"], gr_rank(cfg)
        for j in range(2 * cfg["n_layers"]):
            s[f"gr.{j}.norm.weight"] = (n * d,)
            s[f"gr.{j}.w_down"] = (r, n * d)
            s[f"gr.{j}.w_up"] = (n * d, r)
            s[f"gr.{j}.w_inject"] = (n, n * d)
        s["gr_final.norm.weight"] = (n * d,)
        s["gr_final.w_down"] = (r, n * d)
        s["gr_final.w_up"] = (n * d, r)
    if depth:
        s["final_res.query"] = (d,)
        s["final_res.key_norm.weight"] = (d,)
    if cfg["residual"] != "gr":
        s["final_norm.weight"] = (d,)
    if not cfg["tie_embeddings"]:
        s["lm_head.weight"] = (V, d)
    return s


def check_params(cfg, params):
    want = param_shapes(cfg)
    missing = sorted(set(want) - set(params))
    unexpected = sorted(set(params) - set(want))
    if missing or unexpected:
        raise ValueError(f"parameter set mismatch for residual={cfg['residual']}: missing {missing}, "
                         f"unexpected {unexpected}")
    bad = [f"{n}: {list(params[n].shape)} != {list(want[n])}" for n in want if tuple(params[n].shape) != want[n]]
    if bad:
        raise ValueError("parameter shape mismatch: " + "; ".join(bad))


def random_params(cfg, seed=0, std=0.02, query_std=0.0):
    """Random float64 weights for tests: matrices ~ N(0, std), norm/key-norm weights 1 + N(0, 0.1),
    pseudo-queries ~ N(0, query_std) (0 = the spec's zero initialisation)."""
    g = torch.Generator().manual_seed(seed)
    P = {}
    for name, shape in param_shapes(cfg).items():
        if len(shape) == 2:
            P[name] = torch.randn(shape, generator=g) * std
        elif name.endswith("query"):
            P[name] = torch.randn(shape, generator=g) * query_std
        else:
            P[name] = 1.0 + 0.1 * torch.randn(shape, generator=g)
    return P


# ----------------------------------------------------------------------------------------------------------
# model pieces
# ----------------------------------------------------------------------------------------------------------
def rms_norm(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def depth_read(sources, w, gamma, eps, uniform=False):
    """One AttnRes read (spec §2). sources: list of [..., d] tensors; returns (h, alpha [n, ...]).
    r_s = (mean_k v_sk^2 + eps)^-1/2, z_s = sum_k w_k gamma_k r_s v_sk (no 1/sqrt(d)),
    alpha = softmax_s(z), h = sum_s alpha_s v_s (raw sources). uniform=True: alpha = 1/n (frozen route)."""
    v = torch.stack(sources)  # [n, ..., d]
    if uniform:
        alpha = torch.full(v.shape[:-1], 1.0 / len(sources))
    else:
        r = ((v * v).mean(-1, keepdim=True) + eps) ** -0.5
        z = (v * r * (w * gamma)).sum(-1)  # [n, ...]
        alpha = torch.softmax(z, dim=0)
    h = (alpha.unsqueeze(-1) * v).sum(0)
    return h, alpha


def rope(x, theta):
    """x: [B, H, T, hd]. HF-Llama rotate-half RoPE, positions 0..T-1."""
    T, hd = x.shape[-2], x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)  # theta^(-2i/hd), i < hd/2
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]  # [T, hd/2]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def vres_lambdas(cfg, P, p):
    """(lambda1, lambda2) of one attention layer after the first (baselines-spec §5.1)."""
    mode = cfg["vres_mode"]
    if mode == "fixed":
        return 0.5, 0.5
    if mode == "constant":
        return cfg["vres_lambda1"], cfg["vres_lambda2"]
    lam = P[p + "attn.vres_lambda"]
    return (lam[0], 1.0 - lam[0]) if mode == "learned_convex" else (lam[0], lam[1])


def attention(P, p, cfg, x_qk, x_v, values=None, x_k=None):
    """values: with value_residual, a dict that keeps the first layer's projected values ("v1").
    x_k: K's own input (MUDD); default x_qk."""
    B, T, d = x_qk.shape
    H = cfg["n_heads"]
    hd = d // H

    def heads(t):
        return t.view(B, T, H, hd).transpose(1, 2)

    q = rope(heads(x_qk @ P[p + "attn.wq.weight"].T), cfg["rope_theta"])
    k = rope(heads((x_qk if x_k is None else x_k) @ P[p + "attn.wk.weight"].T), cfg["rope_theta"])
    v_raw = x_v @ P[p + "attn.wv.weight"].T
    if values is not None:
        if "v1" not in values:
            values["v1"] = v_raw
        else:
            l1, l2 = vres_lambdas(cfg, P, p)
            v_raw = value_residual(values["v1"], v_raw, l1, l2)
    v = heads(v_raw)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    s = s.masked_fill(~causal, float("-inf"))
    o = torch.softmax(s, dim=-1) @ v  # [B, H, T, hd]
    return o.transpose(1, 2).reshape(B, T, d) @ P[p + "attn.wo.weight"].T


def mlp(P, p, x):
    gate = x @ P[p + "mlp.w_gate.weight"].T
    up = x @ P[p + "mlp.w_up.weight"].T
    return (torch.nn.functional.silu(gate) * up) @ P[p + "mlp.w_down.weight"].T


# ----------------------------------------------------------------------------------------------------------
# baseline residual-mixing ops (shared/docs/baselines-spec.md), per token over any leading dims; forward()
# uses all of them (dwa, mudd_da, value_residual, the HC / mHC ones). Matrices are [out, in] as in the C++ kernels and the checkpoints.
# ----------------------------------------------------------------------------------------------------------
def dwa_sources(block, dilation, period):
    """DenseFormer k x p schedule (spec §1.1): block i (1-based) has a DWA iff i % p == 0, reading X_j for
    j <= i, j = i (mod k), increasing."""
    if block % period != 0:
        return []
    return [j for j in range(block + 1) if j % dilation == block % dilation]


def dwa(sources, alpha):
    """Y = sum_j alpha_j X_j (spec §1.1)."""
    return torch.einsum("s,s...->...", alpha, torch.stack(sources))


def mudd_hidden_width(ways, n_sources, expand, round_to):
    """Generator width K (spec §2.1): C*S*e, or (floor(C*S*e / round) + 1) * round."""
    k = ways * n_sources * expand
    return (k // round_to + 1) * round_to if round_to > 0 else k


def mudd_da(sources, x, w1, w2, a, eps, gelu="erf", gen_norm=None, post_norm=None):
    """One MUDD DA (spec §2.1-2.2). sources: S tensors [..., d] (the normalised ones with PrePostDANorm), x: the
    block output [..., d]; w1 [K, d], w2 [C*S, K] (None: static, dw = a), a [C, S]. Returns (streams, dw):
    C tensors [..., d] in the order Q, K, V, R (R last) and dw [..., C, S]."""
    C, S = a.shape
    if w1 is None:
        dw = a.expand(x.shape[:-1] + (C, S))
    else:
        nx = x * ((x * x).mean(-1, keepdim=True) + eps) ** -0.5
        if gen_norm is not None:
            nx = nx * gen_norm
        g = torch.nn.functional.gelu(nx @ w1.T, approximate="tanh" if gelu == "tanh" else "none")
        dw = (g @ w2.T).unflatten(-1, (C, S)) + a  # c-major
    mix = dw @ torch.stack(sources, -2)  # [..., C, d]
    if post_norm is None:
        return list(mix.unbind(-2)), dw
    streams = [x + mix[..., c, :] for c in range(C - 1)]
    streams.append(x + rms_norm(mix[..., C - 1, :], post_norm, eps))
    return streams, dw


def hc_coefficients(H, A, B, eps, w_alpha=None, w_beta=None, s_alpha=None, s_beta=None, norm=None, tanh=True):
    """Hyper-connection coefficients (spec §3.1). H [..., n, d]; A [n, n+1] (column 0 = A_m), B [n];
    dynamic when w_alpha ([n+1, d]) is given. Returns alpha [..., n, n+1], beta [..., n]."""
    if w_alpha is None:
        return A.expand(H.shape[:-2] + A.shape), B.expand(H.shape[:-2] + B.shape)
    act = torch.tanh if tanh else (lambda t: t)
    hb = rms_norm(H, norm, eps)
    return s_alpha * act(hb @ w_alpha.T) + A, s_beta * act(hb @ w_beta) + B


def stream_read(H, alpha):
    """h = sum_i alpha[i, 0] H_i."""
    return (alpha[..., :, 0:1] * H).sum(-2)


def stream_write(H, alpha, beta, y):
    """H_new_k = sum_i alpha[i, k+1] H_i + beta_k y."""
    return alpha[..., :, 1:].transpose(-1, -2) @ H + beta[..., :, None] * y[..., None, :]


def sinkhorn(Z, iters, order="col_row"):
    """Sinkhorn-Knopp (spec §4.1): exp(Z - max Z) (the max, per matrix, a constant), then per iteration
    columns then rows (col_row) or rows then columns (row_col)."""
    M = torch.exp(Z - Z.detach().amax(dim=(-2, -1), keepdim=True))
    axes = (-2, -1) if order == "col_row" else (-1, -2)  # summing over dim -2 normalises columns
    for _ in range(iters):
        for ax in axes:
            M = M / M.sum(dim=ax, keepdim=True)
    return M


def mhc_coefficients(x, phi, alpha, b, eps, iters=20, order="col_row", pre_eps=0.0):
    """mHC maps (spec §4.1). x [..., n, d]; phi [n(n+2), n*d]; alpha [3]; b [n(n+2)].
    Returns H_pre [..., n], H_post [..., n], H_res [..., n, n]."""
    n, d = x.shape[-2:]
    v = x.flatten(-2)
    z = (v * ((v * v).mean(-1, keepdim=True) + eps) ** -0.5) @ phi.T
    h_pre = torch.sigmoid(alpha[0] * z[..., :n] + b[:n]) + pre_eps
    h_post = 2 * torch.sigmoid(alpha[1] * z[..., n:2 * n] + b[n:2 * n])
    h_res = sinkhorn((alpha[2] * z[..., 2 * n:] + b[2 * n:]).unflatten(-1, (n, n)), iters, order)
    return h_pre, h_post, h_res


def mhc_read(x, h_pre):
    return (h_pre[..., :, None] * x).sum(-2)


def mhc_write(x, h_post, h_res, y):
    """x'_i = sum_j H_res[i, j] x_j + H_post[i] y."""
    return h_res @ x + h_post[..., :, None] * y[..., None, :]


def value_residual(v1, vn, lambda1, lambda2):
    """V' = lambda1 V_1 + lambda2 V_n (spec §5.1)."""
    return lambda1 * v1 + lambda2 * vn


# ----------------------------------------------------------------------------------------------------------
# Delta AttnRes and the Gated Residual (docs/delta-gated-spec.md)
# ----------------------------------------------------------------------------------------------------------
def delta_read(sources, w, gamma, eps):
    """The correction of one Delta AttnRes read (spec §1.2): keys r_s v_s * gamma as an AttnRes read, but
    the output c = sum_s alpha_s v_s is added to the running stream by the caller (h = x + g c), not used in
    its place. sources: list of [..., d]. Returns (c, alpha [n, ...])."""
    return depth_read(sources, w, gamma, eps)


def delta_gate(cfg, P, read, x):
    """g of h = x + g c (spec §1.3): 1 (none), sigmoid(logit), alpha, or sigmoid(W x + b) per channel."""
    kind = cfg["delta_gate"]
    if kind == "none":
        return 1.0
    if kind == "sigmoid_scalar":
        return torch.sigmoid(P[read + ".gate_logit"])
    if kind == "learnable_alpha":
        return P[read + ".gate_alpha"]
    return torch.sigmoid(x @ P[read + ".gate.weight"].T + P[read + ".gate.bias"])


def delta_sources(cfg, j, emb, outputs):
    """The sources of sublayer j's read (spec §1.1), as (tensors, ids): ids EMBEDDING-like -1 for the embedding,
    k for the sum of the outputs of a block up to sublayer k (per-sublayer deltas: k = the sublayer itself).
    outputs: the sublayer outputs f_0 .. f_{j-1}. The embedding is a source from sublayer 1 on."""
    if j == 0:
        return [], []
    L = 2 * cfg["n_layers"]
    S = L // cfg["n_blocks"]
    partial_mode = cfg["residual"] == "delta" or cfg["delta_block_partial"]
    tensors, ids = [emb], [-1]
    if partial_mode:  # completed blocks, then the current block's partial sum (Block AttnRes's source set)
        ends = [k for k in range(j) if (k + 1) % S == 0] + ([j - 1] if j % S != 0 else [])
    else:  # the released code: a block becomes a source one sublayer after the block that follows it starts
        ends = [m * S - 1 for m in range(1, L // S + 1) if m * S + 1 <= j]
    for k in ends:  # the block holding sublayer k: the sum of its outputs up to f_k, left to right
        block = outputs[(k // S) * S]
        for f in outputs[(k // S) * S + 1:k + 1]:
            block = block + f
        tensors.append(block)
        ids.append(k)
    return tensors, ids


def delta_trunk(cfg, P, emb, values, record=None):
    """delta / delta_block (spec §1): the pre-norm residual stream x_{j+1} = x_j + f_j, where sublayer j's input
    is RMSNorm_j(h_j), h_j = x_j + g_j sum_s alpha_s v_s over the deltas v_s (the embedding, then every earlier
    sublayer output, or block sums) with an optional learned null source first; no final read."""
    eps = cfg["norm_eps"]
    x, outputs = emb, []
    decoupled = cfg["delta_value_route"] == "decoupled"
    for j in range(2 * cfg["n_layers"]):
        k, is_mlp = divmod(j, 2)
        p = f"layers.{k}."
        read = p + ("mlp_res" if is_mlp else "attn_res")
        sources, _ = delta_sources(cfg, j, emb, outputs)
        if cfg["delta_null_source"]:
            sources = [P[read + ".null_source"].expand_as(x)] + sources
        h = h_v = x
        if sources:
            g = delta_gate(cfg, P, read, x)
            c, al = delta_read(sources, P[read + ".query"], P[read + ".key_norm.weight"], eps)
            h = x + g * c
            if record is not None:
                record.append((read, al))
            if decoupled and not is_mlp:  # the V route: own query and key norm, same sources and gate
                c_v, al_v = delta_read(sources, P[read + ".value_query"], P[read + ".value_key_norm.weight"], eps)
                h_v = x + g * c_v
                if record is not None:
                    record.append((read + ".value", al_v))
            else:
                h_v = h
        if is_mlp:
            out = mlp(P, p, rms_norm(h, P[p + "mlp_norm.weight"], eps))
        else:
            nw = P[p + "attn_norm.weight"]
            x_qk = rms_norm(h, nw, eps)
            out = attention(P, p, cfg, x_qk, x_qk if h_v is h else rms_norm(h_v, nw, eps), values)
        outputs.append(out)
        x = x + out
    return x


def gr_read(H, norm_w, w_down, w_up, eps):
    """Gated Residual read (spec §2.1). H [..., n, d]; norm_w [n d] (zero-centred: applied as 1 + w); w_down
    [r, n d]; w_up [n d, r]. Hn_i = RMSNorm(H_i) (1 + w_i); G = sigmoid(W_up silu(W_down vec(Hn) / n));
    x = mean_i G_i * Hn_i. Returns (x, Hn, G)."""
    n, d = H.shape[-2:]
    Hn = H * ((H * H).mean(-1, keepdim=True) + eps) ** -0.5 * (1.0 + norm_w.view(n, d))
    a = torch.nn.functional.silu((Hn.flatten(-2) @ w_down.T) / n)
    G = torch.sigmoid(a @ w_up.T).unflatten(-1, (n, d))
    return (G * Hn).mean(-2), Hn, G


def gr_write(H, Hn, w_inject, y):
    """Gated Residual write (spec §2.1): beta = 2 sigmoid(W_inject vec(Hn) / n) [..., n]; H'_i = H_i + beta_i y.
    Returns (H', beta)."""
    n = H.shape[-2]
    beta = 2 * torch.sigmoid((Hn.flatten(-2) @ w_inject.T) / n)
    return H + beta[..., :, None] * y[..., None, :], beta


def gr_trunk(cfg, P, emb, values, record=None):
    """gr (spec §2): n copies of the embedding; sublayer j reads x = GR_j(H) (its own pre-norm replaced), writes
    H_i += beta_i f_j(x); the final mixer's read feeds the LM head (no final norm)."""
    eps, n = cfg["norm_eps"], cfg["gr_n"]
    H = emb.unsqueeze(-2).expand(emb.shape[:-1] + (n, emb.shape[-1]))
    for j in range(2 * cfg["n_layers"]):
        k, is_mlp = divmod(j, 2)
        p, q = f"layers.{k}.", f"gr.{j}."
        x, Hn, G = gr_read(H, P[q + "norm.weight"], P[q + "w_down"], P[q + "w_up"], eps)
        y = mlp(P, p, x) if is_mlp else attention(P, p, cfg, x, x, values)
        H, beta = gr_write(H, Hn, P[q + "w_inject"], y)
        if record is not None:  # per branch: the read gate's mean over channels, the write gate
            record.append((q + "read", G.mean(-1).movedim(-1, 0)))
            record.append((q + "write", beta.movedim(-1, 0)))
    x, _, G = gr_read(H, P["gr_final.norm.weight"], P["gr_final.w_down"], P["gr_final.w_up"], eps)
    if record is not None:
        record.append(("gr_final.read", G.mean(-1).movedim(-1, 0)))
    return x


def forward(cfg, P, inputs, record=None):
    """inputs: int64 [B, T] -> logits [B, T, V]. record: optional list receiving (name, alpha) per read."""
    eps = cfg["norm_eps"]
    T = inputs.shape[1]
    if cfg["max_seq_len"] is not None and T > cfg["max_seq_len"]:
        raise ValueError(f"sequence length {T} > max_seq_len {cfg['max_seq_len']}")
    emb = P["tok_emb.weight"][inputs]  # [B, T, d]
    L = 2 * cfg["n_layers"]
    values = {} if cfg["value_residual"] else None

    if cfg["residual"] in ("hc", "mhc"):
        x = stream_trunk(cfg, P, emb, values)
    elif cfg["residual"] in ("prenorm", "denseformer"):
        x = emb
        outputs = [emb]  # DenseFormer: the block outputs X_0 (the embedding) .. X_i
        for k in range(cfg["n_layers"]):
            p = f"layers.{k}."
            a = rms_norm(x, P[p + "attn_norm.weight"], eps)
            x = x + attention(P, p, cfg, a, a, values)
            x = x + mlp(P, p, rms_norm(x, P[p + "mlp_norm.weight"], eps))
            if cfg["residual"] == "denseformer":
                outputs.append(x)
                src = dwa_sources(k + 1, cfg["dwa_dilation"], cfg["dwa_period"])
                if src:  # Y_i = sum_j alpha_j X_j feeds the next block; otherwise X_i passes on
                    x = dwa([outputs[j] for j in src], P[f"dwa.{k + 1}.alpha"])
    elif cfg["residual"] == "mudd":
        x = mudd_trunk(cfg, P, emb, values)
    elif cfg["residual"] in DELTA_MODES:
        x = delta_trunk(cfg, P, emb, values, record)
    elif cfg["residual"] == "gr":  # the final mixer is the final norm: straight to the head
        x = gr_trunk(cfg, P, emb, values, record)
        head = P["tok_emb.weight"] if cfg["tie_embeddings"] else P["lm_head.weight"]
        return x @ head.T
    else:  # full / block / rd
        S = L // cfg["n_blocks"]  # sublayers per block (1 for full)
        blocks, partial = [emb], None  # blocks = [b_0, ..., b_{n-1}]; partial = b_n^{i-1} (None when i = 1)
        for j in range(L):
            k, is_mlp = divmod(j, 2)
            p = f"layers.{k}."
            if j % S == 0 and j > 0:  # a new block starts: the finished partial becomes b_n
                blocks.append(partial)
                partial = None
            sources = blocks + ([partial] if partial is not None else [])
            if is_mlp:
                h, al = depth_read(sources, P[p + "mlp_res.query"], P[p + "mlp_res.key_norm.weight"], eps)
                if record is not None:
                    record.append((p + "mlp_res", al))
                out = mlp(P, p, rms_norm(h, P[p + "mlp_norm.weight"], eps))
            else:
                gamma, nw = P[p + "attn_res.key_norm.weight"], P[p + "attn_norm.weight"]
                h_qk, al = depth_read(sources, P[p + "attn_res.query"], gamma, eps)
                if record is not None:
                    record.append((p + "attn_res", al))
                route = cfg["value_route"] if cfg["residual"] == "rd" else "tied"
                if route == "tied":  # block / full, and rd+tied: one route feeds Q, K and V
                    x_qk = x_v = rms_norm(h_qk, nw, eps)
                elif route == "decoupled":
                    h_v, al_v = depth_read(sources, P[p + "attn_res.value_query"], gamma, eps)
                    x_qk, x_v = rms_norm(h_qk, nw, eps), rms_norm(h_v, nw, eps)
                elif route == "average":
                    h_v, al_v = depth_read(sources, P[p + "attn_res.value_query"], gamma, eps)
                    x_qk = x_v = rms_norm(0.5 * (h_qk + h_v), nw, eps)
                elif route == "frozen":
                    h_v, al_v = depth_read(sources, None, None, eps, uniform=True)
                    x_qk, x_v = rms_norm(h_qk, nw, eps), rms_norm(h_v, nw, eps)
                else:
                    raise ValueError(route)
                if record is not None and route != "tied":
                    record.append((p + "attn_res.value", al_v))
                out = attention(P, p, cfg, x_qk, x_v, values)
            partial = out if partial is None else partial + out  # write-back b_n^i = b_n^{i-1} + f_j
        blocks.append(partial)  # b_N
        x, al = depth_read(blocks, P["final_res.query"], P["final_res.key_norm.weight"], eps)
        if record is not None:
            record.append(("final_res", al))

    x = rms_norm(x, P["final_norm.weight"], eps)
    head = P["tok_emb.weight"] if cfg["tie_embeddings"] else P["lm_head.weight"]
    return x @ head.T


def stream_trunk(cfg, P, emb, values):
    """hc / mhc (spec §3.1, §4.1): H^0 = n copies of the embedding [B, T, n, d]; sublayer j (global index,
    attention 2k, MLP 2k+1) reads h from H with its module, computes y = f_j(RMSNorm_j(h)) and writes
    H <- mixed streams + output weights * y; the exit is sum_k H_k (or the mean)."""
    eps = cfg["norm_eps"]
    hc = cfg["residual"] == "hc"
    n = cfg["hc_n"] if hc else cfg["mhc_n"]
    H = emb.unsqueeze(-2).expand(emb.shape[:-1] + (n, emb.shape[-1]))
    for j in range(2 * cfg["n_layers"]):
        k, is_mlp = divmod(j, 2)
        p = f"layers.{k}."
        if hc:
            q = f"hc.{j}."
            dyn = () if not cfg["hc_dynamic"] else (P[q + "w_alpha"], P[q + "w_beta"], P[q + "s_alpha"],
                                                   P[q + "s_beta"], P[q + "norm.weight"])
            alpha, beta = hc_coefficients(H, P[q + "A"], P[q + "B"], eps, *dyn, tanh=cfg["hc_tanh"])
            h = stream_read(H, alpha)
        else:
            q = f"mhc.{j}."
            h_pre, h_post, h_res = mhc_coefficients(H, P[q + "phi"], P[q + "alpha"], P[q + "b"], eps,
                                                    cfg["mhc_sinkhorn_iters"], cfg["mhc_sinkhorn_order"],
                                                    cfg["mhc_pre_eps"])
            h = mhc_read(H, h_pre)
        if is_mlp:
            y = mlp(P, p, rms_norm(h, P[p + "mlp_norm.weight"], eps))
        else:
            a = rms_norm(h, P[p + "attn_norm.weight"], eps)
            y = attention(P, p, cfg, a, a, values)
        H = stream_write(H, alpha, beta, y) if hc else mhc_write(H, h_post, h_res, y)
    readout = cfg["hc_reduce"] if hc else cfg["mhc_reduce"]
    return H.sum(-2) if readout == "sum" else H.mean(-2)
def mudd_trunk(cfg, P, emb, values):
    """MUDDFormer (baselines-spec §2.1-2.2): block k takes Q, K, V through three pre-norms (one weight each with
    mudd_sep_qkv_norm, else attn_norm for all) and h = x_R + Attn, X_{k+1} = h + MLP(RMSNorm(h)); the DA module
    after it mixes X_0..X_{k+1} into the next block's streams. Block 0 reads the embedding on every stream; the
    last DA's R stream is the output. Returns the final norm's input."""
    eps = cfg["norm_eps"]
    prepost = cfg["mudd_prepost_norm"]
    X = [emb]  # block outputs
    Xn = [rms_norm(emb, P["mudd.src_norm.0.weight"], eps)] if prepost else None  # PrePost: normalised sources
    x_q = x_k = x_v = x_r = emb
    for k in range(cfg["n_layers"]):
        p = f"layers.{k}."
        n_q = P[p + "attn_norm.weight"]
        n_k = P.get(p + "attn_norm_k.weight", n_q)
        n_v = P.get(p + "attn_norm_v.weight", n_q)
        h = x_r + attention(P, p, cfg, rms_norm(x_q, n_q, eps), rms_norm(x_v, n_v, eps), values,
                            x_k=rms_norm(x_k, n_k, eps))
        x = h + mlp(P, p, rms_norm(h, P[p + "mlp_norm.weight"], eps))
        X.append(x)
        if prepost:
            Xn.append(rms_norm(x, P[f"mudd.src_norm.{k + 1}.weight"], eps))
        q = f"mudd.{k}."
        streams, _ = mudd_da(Xn if prepost else X, x, P.get(q + "w1"), P.get(q + "w2"), P[q + "a"], eps,
                             cfg["mudd_gelu"], P.get(q + "gen_norm.weight"), P.get(q + "post_norm.weight"))
        if len(streams) == 4:
            x_q, x_k, x_v, x_r = streams
        else:  # R alone (mudd_ways = r, or the last DA): every input of the next block
            x_q = x_k = x_v = x_r = streams[0]
    return x_r


def loss_and_logits(cfg, P, tokens):
    """tokens: int64 [B, T+1]. Mean cross-entropy over all B*T positions."""
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    logits = forward(cfg, P, inputs)
    logp = torch.log_softmax(logits, dim=-1)
    loss = -logp.gather(-1, targets.unsqueeze(-1)).mean()
    return loss, logits


# ----------------------------------------------------------------------------------------------------------
# training
# ----------------------------------------------------------------------------------------------------------
def lr_at(s, lr_max, warmup=0, total_steps=1, min_lr_ratio=0.0, schedule="cosine", decay_fraction=0.2):
    """Learning rate of update s (0-based); formulas in the module docstring."""
    if s < warmup:
        return lr_max * (s + 1) / warmup
    floor = min_lr_ratio * lr_max
    if schedule == "cosine":
        p = (s - warmup) / max(1, total_steps - warmup)
        return floor + (lr_max - floor) * 0.5 * (1.0 + math.cos(math.pi * p))
    if schedule == "wsd":
        decay_start = total_steps - int(math.floor(decay_fraction * total_steps + 0.5))
        if s < decay_start:
            return lr_max
        frac = (s - decay_start) / max(1, total_steps - decay_start)
        return lr_max + (floor - lr_max) * frac
    raise ValueError(f"unknown schedule {schedule!r}")


def decayed(cfg, name, p):
    """Weight decay (module docstring): matrices, DenseFormer's DWA weights when dwa_weight_decay; HC: only the
    dynamic projections w_alpha, w_beta (not A, B, s, the norm); mHC: only phi; MUDD: W1, W2 and, when
    mudd_decay_all, every other mudd.* parameter (spec §6.2)."""
    if name.startswith("hc."):
        return name.endswith((".w_alpha", ".w_beta"))
    if name.startswith("mhc."):
        return name.endswith(".phi")
    if name.startswith("mudd."):  # W1, W2; the rest when mudd_decay_all
        return name.endswith(".w1") or name.endswith(".w2") or cfg["mudd_decay_all"]
    if cfg["residual"] in DELTA_MODES and ("attn_res." in name or "mlp_res." in name):
        return cfg["delta_decay_all"] or p.dim() == 2  # the released code decays everything (spec §1.6)
    if name.startswith(("gr.", "gr_final.")):  # the matrices; the zero-centred norms when gr_decay_norm
        return p.dim() == 2 or cfg["gr_decay_norm"]
    return p.dim() == 2 or (name.startswith("dwa.") and cfg["dwa_weight_decay"])


def zero_if_none(t):
    """A parameter's gradient, zeros where the loss does not use it (Delta AttnRes's first attention read has no
    sources: its query and key norm take no part in the computation)."""
    return t.grad if t.grad is not None else torch.zeros_like(t)


def train_adamw(cfg, P, tokens, steps, lr, weight_decay=0.0, clip=0.0, warmup=0, min_lr_ratio=0.0,
                schedule="cosine", decay_fraction=0.2, total_steps=None, beta1=0.9, beta2=0.95, eps=1e-8):
    """Runs `steps` AdamW updates on the same batch. Returns (losses [steps], new params dict)."""
    total_steps = steps if total_steps is None else total_steps
    P = {n: t.detach().clone().requires_grad_(True) for n, t in P.items()}
    m = {n: torch.zeros_like(t) for n, t in P.items()}
    v = {n: torch.zeros_like(t) for n, t in P.items()}
    losses = []
    for s in range(steps):
        for t in P.values():
            t.grad = None
        loss, _ = loss_and_logits(cfg, P, tokens)
        loss.backward()
        losses.append(loss.item())
        grads = {n: zero_if_none(t) for n, t in P.items()}
        if clip > 0:
            total = math.sqrt(sum(float((g * g).sum()) for g in grads.values()))
            coef = clip / (total + 1e-6)
            if coef < 1.0:
                grads = {n: g * coef for n, g in grads.items()}
        lr_s = lr_at(s, lr, warmup, total_steps, min_lr_ratio, schedule, decay_fraction)
        t_ = s + 1
        with torch.no_grad():
            for n, p in P.items():
                g = grads[n]
                if decayed(cfg, n, p):
                    p.mul_(1.0 - lr_s * weight_decay)
                m[n] = beta1 * m[n] + (1.0 - beta1) * g
                v[n] = beta2 * v[n] + (1.0 - beta2) * g * g
                denom = v[n].sqrt() / math.sqrt(1.0 - beta2 ** t_) + eps
                p.sub_((lr_s / (1.0 - beta1 ** t_)) * m[n] / denom)
    return torch.tensor(losses), {n: t.detach() for n, t in P.items()}


# ----------------------------------------------------------------------------------------------------------
# command line
# ----------------------------------------------------------------------------------------------------------
def load_model(path):
    arrays, meta = load_safetensors(path)
    if "config" not in meta:
        raise ValueError(f"{path}: no 'config' in safetensors metadata")
    cfg = parse_config(meta["config"])
    P = {n: torch.from_numpy(a.astype(np.float64)) for n, a in arrays.items()}
    check_params(cfg, P)
    return cfg, P


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--weights", required=True)
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--adamw-steps", type=int, default=0)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--clip", type=float, default=0.0)
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--min-lr-ratio", type=float, default=0.0)
    ap.add_argument("--schedule", choices=("cosine", "wsd"), default="cosine")
    ap.add_argument("--decay-fraction", type=float, default=0.2)
    ap.add_argument("--total-steps", type=int, default=None)
    ap.add_argument("--cache", default=None,
                    help="a directory of earlier outputs: the same inputs, options and reference code (their SHA-256) "
                         "are copied from there instead of computed again (the C++ reference test's rerun with other "
                         "BLAS kernels recomputes only the C++ side)")
    ap.add_argument("--rounding-trials", type=int, default=0,
                    help="also write rounding.<name> for every output: the float32 "
                         "rounding sensitivity of the computation (tests/reference/rounding.py) over this many trials")
    a = ap.parse_args(argv)

    cached = None
    if a.cache:
        import hashlib
        import os
        import shutil
        key = hashlib.sha256()
        here = os.path.dirname(os.path.abspath(__file__))
        for path in (os.path.join(here, "attnres_ref.py"), os.path.join(here, "rounding.py"), a.weights, a.tokens):
            with open(path, "rb") as f:
                key.update(f.read())
        key.update(repr(sorted((k, v) for k, v in vars(a).items() if k not in ("out", "cache", "weights", "tokens")))
                   .encode())
        cached = os.path.join(a.cache, key.hexdigest() + ".safetensors")
        if os.path.exists(cached):
            shutil.copyfile(cached, a.out)
            return 0

    cfg, P = load_model(a.weights)
    tok_arrays, _ = load_safetensors(a.tokens)
    if "tokens" not in tok_arrays:
        raise ValueError(f"{a.tokens}: no tensor 'tokens'")
    tokens = torch.from_numpy(tok_arrays["tokens"].astype(np.int64))
    if tokens.dim() != 2 or tokens.shape[1] < 2:
        raise ValueError(f"tokens must be [B, T+1] with T >= 1, got {list(tokens.shape)}")
    if tokens.min() < 0 or tokens.max() >= cfg["vocab_size"]:
        raise ValueError("token id out of range")

    def compute():
        Pg = {n: t.clone().requires_grad_(True) for n, t in P.items()}
        loss, logits = loss_and_logits(cfg, Pg, tokens)
        loss.backward()
        out = {"logits": logits.detach(), "loss": loss.detach().reshape(())}
        for n, t in Pg.items():
            out["grad." + n] = zero_if_none(t)
        if a.adamw_steps > 0:
            losses, newP = train_adamw(cfg, P, tokens, a.adamw_steps, a.lr, a.weight_decay, a.clip, a.warmup,
                                       a.min_lr_ratio, a.schedule, a.decay_fraction, a.total_steps)
            out["losses"] = losses
            for n, t in newP.items():
                out["param." + n] = t
        return out

    out = compute()
    if a.rounding_trials > 0:
        import rounding  # beside this file
        estimate = rounding.rounding_estimate(compute, trials=a.rounding_trials, exact=out)
        out.update({"rounding." + k: v for k, v in estimate.deviation.items()})
    save_safetensors(a.out, {n: t.to(torch.float64) for n, t in out.items()}, {"config": json.dumps(cfg)})
    if cached:  # complete files only: copied beside, then renamed
        os.makedirs(a.cache, exist_ok=True)
        partial = f"{cached}.{os.getpid()}.tmp"
        shutil.copyfile(a.out, partial)
        os.replace(partial, cached)
    return 0


if __name__ == "__main__":
    sys.exit(main())
