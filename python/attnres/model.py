"""The attnres model as a torch.nn.Module: eager, efficient, every residual mode and control.

It computes the function of src/model (and of the float64 oracle tests/reference/attnres_ref.py,
which is written for clarity, not speed): a decoder-only pre-norm Transformer with RoPE, SwiGLU and
a tied or untied LM head, whose sublayers read their input through one of the residual modes of
docs/model.md and /work/shared/docs/attnres-spec.md. Parameter names are the checkpoints' names, so
``model.state_dict()`` is a checkpoint's tensor set.

Efficiency (this is also the PyTorch side of `attnres bench`, attnres.bench_worker):
  * attention is matmul + additive causal mask + softmax + matmul (Debian's torch 1.13 has no
    scaled_dot_product_attention), with 1/sqrt(head_dim) folded into W_Q; on a torch that has it,
    ``model.set_attention("sdpa")`` computes training and scoring passes (no KV cache) with
    F.scaled_dot_product_attention(is_causal=True, scale=1) instead: the fused (flash) kernels on
    a GPU (scripts/torch_peer.py), the same function;
  * depth reads never stack their sources (that would keep an O(n_sources) copy per read for the
    backward, the memory pitfall of spec §9): z_s = r_s * (v_s . (w*gamma)) per source, with the RMS
    factor r_s computed once per source and shared by every read of it, and h = sum_s alpha_s v_s;
  * RD's two routes share r_s and gamma, as in the spec;
  * incremental decoding with a KVCache costs one position of work per new token.

A residual mode is one class (ResidualMode): the parameters it adds to each layer and to the model,
the modules holding them, and the trunk that turns the embedding into the final hidden state. New
modes register themselves in MODES. The baselines of /work/shared/docs/baselines-spec.md:
DenseFormer (§1) is the mode DenseFormer, MUDDFormer (§2) the mode Mudd, Hyper-Connections and mHC
(§3-4) the mode StreamResiduals; ResFormer's value residual (§5) is an option of every mode, inside
the attention sublayer (ValueResidual). The modes of docs/delta-gated-spec.md: Delta AttnRes (`delta`,
`delta_block`, §1; also in the C++, src/model/delta_trunk.cpp) is DeltaAttnRes, the Gated Residual of
Qwen3.8-Flash-Next (`gr`, §2, which the C++ does not implement yet) is GatedResidualMode.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .config import DELTA_MODES, ModelConfig

EMBEDDING = -1  # the source id of the token embedding (kEmbedding, src/model/topology.hpp)
NULL_SOURCE = -2  # the source id of Delta AttnRes's learned null source (docs/delta-gated-spec.md §1.3)


# ------------------------------------------------------------------------------------------------
# building blocks
# ------------------------------------------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class ValueResidual:
    """ResFormer's value residual (baselines-spec §5), an option of every residual mode: attention
    layers after the first use V' = lambda1 V_1 + lambda2 V_n, V_1 the first attention layer's
    projected values, V_n their own (before the head split; RoPE never touches V). vres_mode: fixed
    (0.5, 0.5), learned_convex (p, 1 - p), learned_pair (p1, p2), constant (vres_lambda1,
    vres_lambda2); the learned scalars are `layers.{i}.attn.vres_lambda` (i >= 1), initialised to
    (vres_lambda1, vres_lambda2)[:n] (src/kernels/value_residual.cpp)."""

    def __init__(self, config: ModelConfig):
        self.mode = config.vres_mode
        self.constants = (config.vres_lambda1, config.vres_lambda2)
        self.n_params = config.vres_parameters  # learned scalars per layer after the first: 0, 1 or 2

    def initial(self) -> List[float]:
        return list(self.constants[:self.n_params])

    def lambdas(self, param):
        if self.mode == "fixed":
            return 0.5, 0.5
        if self.mode == "learned_convex":
            return param[0], 1.0 - param[0]
        if self.mode == "learned_pair":
            return param[0], param[1]
        return self.constants

    def mix(self, v1, vn, param):
        lambda1, lambda2 = self.lambdas(param)
        return lambda1 * v1 + lambda2 * vn


def sdpa_available() -> bool:
    """Whether this torch has F.scaled_dot_product_attention with `scale` (torch >= 2.1)."""
    f = getattr(F, "scaled_dot_product_attention", None)
    if f is None:
        return False
    try:
        import inspect
        return "scale" in inspect.signature(f).parameters
    except (TypeError, ValueError):  # a builtin without a signature: torch >= 2.1 documents `scale`
        return tuple(int(x) for x in torch.__version__.split(".")[:2] if x.isdigit()) >= (2, 1)


class Attention(nn.Module):
    """Causal multi-head attention; Q and K from x_qk, V from x_v (RD reads them separately). With a
    value residual, layer 0 hands its projected values to the pass and later layers mix them in
    (the KV cache holds the mixed values, as the C++ decode does)."""

    def __init__(self, d: int, n_heads: int, vres: Optional[ValueResidual] = None, layer: int = 0):
        super().__init__()
        self.n_heads = n_heads
        self.scale = 1.0 / math.sqrt(d // n_heads)
        self.wq = nn.Linear(d, d, bias=False)
        self.wk = nn.Linear(d, d, bias=False)
        self.wv = nn.Linear(d, d, bias=False)
        self.wo = nn.Linear(d, d, bias=False)
        self.vres = vres
        self.sdpa = False  # AttnResModel.set_attention
        if vres is not None and layer >= 1 and vres.n_params > 0:  # the first layer keeps its own values
            self.vres_lambda = nn.Parameter(torch.tensor(vres.initial()))

    def forward(self, x_qk, x_v, ctx: "_Pass", layer: int, x_k=None):
        """x_k: K's own input (MUDD's K stream); default x_qk."""
        B, T, d = x_qk.shape
        H = self.n_heads

        def heads(t):
            return t.view(B, T, H, d // H).transpose(1, 2)  # [B, H, T, hd]

        q = ctx.rope(heads(F.linear(x_qk, self.wq.weight * self.scale)))
        k = ctx.rope(heads(F.linear(x_qk if x_k is None else x_k, self.wk.weight)))
        v = F.linear(x_v, self.wv.weight)
        if self.vres is not None:
            if layer == 0:
                ctx.v1 = v
            else:
                v = self.vres.mix(ctx.v1, v, getattr(self, "vres_lambda", None))
        v = heads(v)
        if ctx.cache is not None:
            k, v = ctx.cache.append(layer, k, v)
        elif self.sdpa:  # a whole sequence from position 0: the plain causal mask
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0)
            return F.linear(o.transpose(1, 2).reshape(B, T, d), self.wo.weight)
        s = torch.matmul(q, k.transpose(-1, -2))
        if T > 1:  # a single new token may see every cached position
            s = s + ctx.mask
        o = torch.matmul(torch.softmax(s, dim=-1), v)
        return F.linear(o.transpose(1, 2).reshape(B, T, d), self.wo.weight)


class SwiGLU(nn.Module):
    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.w_gate = nn.Linear(d, hidden, bias=False)
        self.w_up = nn.Linear(d, hidden, bias=False)
        self.w_down = nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        return F.linear(F.silu(F.linear(x, self.w_gate.weight)) * F.linear(x, self.w_up.weight), self.w_down.weight)


class Layer(nn.Module):
    """One transformer layer: attention sublayer 2i and MLP sublayer 2i+1. A residual mode may add
    its own modules (e.g. the depth reads attn_res and mlp_res)."""

    def __init__(self, c: ModelConfig, index: int, vres: Optional[ValueResidual]):
        super().__init__()
        if c.has_prenorm:  # GR's reads replace the pre-norms
            self.attn_norm = RMSNorm(c.d_model, c.norm_eps)  # MUDD qkvr: Q's
        if c.mudd_separate_kv_norms:
            self.attn_norm_k = RMSNorm(c.d_model, c.norm_eps)
            self.attn_norm_v = RMSNorm(c.d_model, c.norm_eps)
        self.attn = Attention(c.d_model, c.n_heads, vres, index)
        if c.has_prenorm:
            self.mlp_norm = RMSNorm(c.d_model, c.norm_eps)
        self.mlp = SwiGLU(c.d_model, c.mlp_hidden)


class DepthRead(nn.Module):
    """The parameters of one AttnRes read (spec §2): pseudo-query w (init 0) and key-norm weight
    gamma (init 1); rd attention reads with a second learned route also have value_query."""

    def __init__(self, d: int, eps: float, value_query: bool = False):
        super().__init__()
        self.query = nn.Parameter(torch.zeros(d))
        self.key_norm = RMSNorm(d, eps)  # only its weight is used: keys are r_s v_s * gamma
        if value_query:
            self.value_query = nn.Parameter(torch.zeros(d))


# ------------------------------------------------------------------------------------------------
# depth-read outputs
# ------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class ReadWeights:
    """The depth weights of one read for every token of a forward pass (Model::read_weights).

    read:    0 .. 2*n_layers-1 is sublayer j's read (even j attention, odd j MLP); 2*n_layers is the
             final read before the final norm.
    sources: what each weight mixes, in order: EMBEDDING (-1) for the token embedding b_0, or j for the
             block partial sum after sublayer j's write-back (C++ ReadPlan::sources).
    qk:      [B, T, n_sources], the softmax weights of the read (of the Q/K route for rd attention).
    v:       [B, T, n_sources], rd attention reads only: the V route (uniform 1/n for `frozen`).
    mixer:   "softmax" for an AttnRes read; "dwa" for a DenseFormer DWA (DenseFormer.trunk): the DWA
             after block i (1-based) is read 2i (its output feeds layer i, or the final norm when
             i = n_layers), sources are the block outputs X_j it averages (EMBEDDING for X_0, 2j - 1
             for X_j, the stream after sublayer 2j - 1: C++ DwaPlan::sources), and qk is its static
             weights dwa.{i}.alpha broadcast to [B, T, n_sources] (any sign, not normalised);
             "delta" for a Delta AttnRes read (DeltaAttnRes.trunk; docs/delta-gated-spec.md §1): softmax
             weights as AttnRes's, but the read adds g * sum_s w_s v_s to the running stream; sources are
             EMBEDDING, NULL_SOURCE (-2) for the learned null source, or j: the sum of a block's sublayer
             outputs up to sublayer j (for `delta`, whose blocks are single sublayers, f_j itself); reads
             without sources (sublayer 0 without a null source) are not recorded;
             "gr" for a Gated Residual module (GatedResidualMode.trunk; §2): sources are its branches
             0 .. gr_n - 1, qk the read gates G (sigmoid, per channel) averaged over the channels
             [B, T, gr_n], v the write gates 2 sigmoid(.) [B, T, gr_n] (None for the final mixer, read
             2 * n_layers).
    """

    read: int
    sources: Tuple[int, ...]
    qk: torch.Tensor
    v: Optional[torch.Tensor]
    n_sublayers: int
    sublayers_per_block: int
    mixer: str = "softmax"

    @property
    def kind(self) -> str:
        if self.read == self.n_sublayers:
            return "final"
        return "attention" if self.read % 2 == 0 else "mlp"

    @property
    def layer(self) -> Optional[int]:
        """The transformer layer of the sublayer reading (None for the final read)."""
        return None if self.read == self.n_sublayers else self.read // 2

    @property
    def routes(self) -> List[torch.Tensor]:
        """Route 0 (Q/K, or the only route) and, where it exists, route 1 (V), as Model::read_weights."""
        return [self.qk] if self.v is None else [self.qk, self.v]

    def source_labels(self) -> List[str]:
        """'emb' for b_0, 'b{n}' for a finished block n, 'b{n}^{i}' for block n's partial sum of i sublayers;
        for a DWA 'emb' for X_0 and 'x{j}' for block j's output X_j."""
        S, out = self.sublayers_per_block, []
        for s in self.sources:
            if self.mixer == "gr":
                out.append(f"branch{s}")
            elif s == EMBEDDING:
                out.append("emb")
            elif s == NULL_SOURCE:
                out.append("null")
            elif self.mixer == "dwa":
                out.append(f"x{(s + 1) // 2}")
            elif (s + 1) % S == 0:
                out.append(f"b{(s + 1) // S}")
            else:
                out.append(f"b{s // S + 1}^{s % S + 1}")
        return out


class KVCache:
    """Keys (after RoPE) and values of every attention layer, for incremental decoding."""

    def __init__(self, config: ModelConfig, batch: int, max_seq: Optional[int] = None, *,
                 dtype=torch.float32, device=None):
        self.max_seq = config.max_seq_len if max_seq is None else max_seq
        if not 1 <= self.max_seq <= config.max_seq_len:
            raise ValueError(f"KVCache: max_seq {self.max_seq} must be between 1 and max_seq_len {config.max_seq_len}")
        shape = (config.n_layers, batch, config.n_heads, self.max_seq, config.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.batch = batch
        self.length = 0  # positions filled (advanced by the model after each forward)

    def append(self, layer: int, k, v):
        T = k.shape[2]
        end = self.length + T
        self.k[layer, :, :, self.length:end] = k
        self.v[layer, :, :, self.length:end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]


class _Pass:
    """What one forward pass shares: RoPE rows and causal mask for its positions, the cache, the
    list receiving depth weights (None: not requested) and, with a value residual, the first
    attention layer's projected values V_1 of this pass's tokens (set by layer 0)."""

    def __init__(self, model: "AttnResModel", T: int, start: int, cache: Optional[KVCache], record):
        w = model.tok_emb.weight
        cos, sin, mask = model._tables(w.dtype, w.device)  # in the parameters' dtype (also under autocast)
        self.cos, self.sin = cos[start:start + T], sin[start:start + T]
        self.mask = mask[start:start + T, :start + T]
        self.cache = cache
        self.record = record
        self.v1 = None

    def rope(self, x):  # x: [B, H, T, hd], rotate-half (HF Llama) convention
        h = x.shape[-1] // 2
        return x * self.cos + torch.cat([-x[..., h:], x[..., :h]], -1) * self.sin


def _rms(v, eps):
    """Per-token inverse RMS of a source, [B, T]: computed once, shared by every read of it."""
    return torch.rsqrt(v.pow(2).mean(-1) + eps)


def _mix(alpha, sources):
    h = alpha[..., 0:1] * sources[0]
    for s in range(1, len(sources)):
        h = h + alpha[..., s:s + 1] * sources[s]
    return h


def _alpha(sources, rms, query, gamma):
    """Softmax over sources of z_s = r_s (v_s . (w * gamma)): no temperature, no 1/sqrt(d) (spec §2)."""
    u = query * gamma
    return torch.softmax(torch.stack([r * torch.matmul(v, u) for v, r in zip(sources, rms)], -1), dim=-1)


# ------------------------------------------------------------------------------------------------
# residual modes
# ------------------------------------------------------------------------------------------------
class ResidualMode:
    """One residual-stream design. Subclasses say which parameters they add (names relative to
    `layers.{i}.` and to the model, in the order of src/model/param_layout.cpp), create the modules
    holding them, and run the trunk: embedding [B, T, d] -> hidden state before the final norm."""

    def __init__(self, config: ModelConfig):
        self.config = config

    def layer_params(self, layer: int) -> List[Tuple[str, Tuple[int, ...]]]:
        return []

    def final_params(self) -> List[Tuple[str, Tuple[int, ...]]]:
        return []

    def build(self, model: "AttnResModel") -> None:
        pass

    def initial_values(self) -> Dict[str, torch.Tensor]:
        """Parameters whose initial value is fixed by the mode (ParamLayout::add_fixed), by name."""
        return {}

    def init_std(self, name: str) -> Optional[float]:
        """The init std of a mode's own random matrix (None: the model's default)."""
        return None

    def decayed(self, name: str, shape: Tuple[int, ...]) -> bool:
        """Whether attnres's AdamW decays the parameter (ParamInfo::decay): the matrices, and never the
        norm weights, queries and value-residual lambdas; a family says how its own parameters are
        decayed (its parameter-group policy) and leaves the rest to this rule."""
        return len(shape) == 2

    def trunk(self, model: "AttnResModel", emb, ctx: _Pass):
        raise NotImplementedError


class PreNorm(ResidualMode):
    """`prenorm`: the standard pre-norm residual stream x_{j+1} = x_j + f_j(RMSNorm(x_j))."""

    @staticmethod
    def block(layer, i, x, ctx):
        """Layer i as a pre-norm block: both sublayers with their residual adds."""
        a = layer.attn_norm(x)
        x = x + layer.attn(a, a, ctx, i)
        return x + layer.mlp(layer.mlp_norm(x))

    def trunk(self, model, emb, ctx):
        x = emb
        for i, layer in enumerate(model.layers):
            x = self.block(layer, i, x, ctx)
        return x


def dwa_sources(block: int, dilation: int, period: int) -> List[int]:
    """DenseFormer's k x p schedule (baselines-spec §1.1, kernels::dwa_sources): block i (1-based) has a
    DWA iff i % period == 0; it reads X_j for 0 <= j <= i with j = i (mod dilation), increasing j, so
    the block's own output last. Empty: no DWA (X_i passes on)."""
    if block < 1 or block % period != 0:
        return []
    return list(range(block % dilation, block + 1, dilation))


class Dwa(nn.Module):
    """The weights of one DWA, `dwa.{i}.alpha` [n_sources]: plain learned scalars, identity at init."""

    def __init__(self, n_sources: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(n_sources))


class DenseFormer(PreNorm):
    """`denseformer` (baselines-spec §1): pre-norm blocks X_i = B_i(Y_{i-1}) (X_0 = Y_0 = the embedding);
    after every dwa_period-th block a DWA Y_i = sum_j alpha_{i,j} X_j over every dwa_dilation-th block
    output (dwa_sources) feeds the next block, other blocks pass Y_i = X_i on; Y_L feeds the final
    norm. With return_weights each DWA records its alpha (a ReadWeights with mixer "dwa")."""

    def decayed(self, name, shape):  # the DWA weights when dwa_weight_decay (the official code's policy)
        return self.config.dwa_weight_decay if name.startswith("dwa.") else super().decayed(name, shape)

    def __init__(self, config):
        super().__init__(config)
        self.plans = {i: src for i in range(1, config.n_layers + 1)
                      if (src := dwa_sources(i, config.dwa_dilation, config.dwa_period))}  # block -> sources
        self.read_outputs = {j for src in self.plans.values() for j in src}  # the X_j some DWA reads

    def final_params(self):
        return [(f"dwa.{i}.alpha", (len(src),)) for i, src in self.plans.items()]

    def build(self, model):
        model.dwa = nn.ModuleDict({str(i): Dwa(len(src)) for i, src in self.plans.items()})

    def trunk(self, model, emb, ctx):
        c = self.config
        x, outputs = emb, {0: emb}  # the block outputs X_j that a DWA reads
        for i, layer in enumerate(model.layers, start=1):
            x = self.block(layer, i - 1, x, ctx)
            if i in self.read_outputs:
                outputs[i] = x
            src = self.plans.get(i)
            if src is None:
                continue
            alpha = model.dwa[str(i)].alpha
            x = _mix(alpha, [outputs[j] for j in src])
            if ctx.record is not None:
                ids = tuple(EMBEDDING if j == 0 else 2 * j - 1 for j in src)
                per_token = x.new_ones(x.shape[:-1] + (1,)) * alpha  # [B, T, n], a graph node as AttnRes's
                ctx.record.append(ReadWeights(2 * i, ids, per_token, None, c.n_sublayers, 2, mixer="dwa"))
        return x


class BlockAttnRes(ResidualMode):
    """`block` (Block AttnRes) and `full` (one block per sublayer): every sublayer reads a softmax
    mixture of [b_0 = embedding, finished blocks b_1.., the current block's partial sum] and adds its
    output to the partial sum; a final read over all blocks feeds the final norm (spec §3-4)."""

    def layer_params(self, layer):
        d = (self.config.d_model,)
        return ([("attn_res.query", d), ("attn_res.key_norm.weight", d)] +
                [("attn_res.value_query", d)] * self.config.has_value_query +
                [("mlp_res.query", d), ("mlp_res.key_norm.weight", d)])

    def final_params(self):
        d = (self.config.d_model,)
        return [("final_res.query", d), ("final_res.key_norm.weight", d)]

    def build(self, model):
        c = self.config
        for layer in model.layers:
            layer.attn_res = DepthRead(c.d_model, c.norm_eps, value_query=c.has_value_query)
            layer.mlp_res = DepthRead(c.d_model, c.norm_eps)
        model.final_res = DepthRead(c.d_model, c.norm_eps)

    def read(self, j, ids, sources, rms, query, gamma, ctx):
        """One single-route read; records its weights when asked. Returns h."""
        if len(sources) == 1:
            alpha = None
            h = sources[0]
        else:
            alpha = _alpha(sources, rms, query, gamma)
            h = _mix(alpha, sources)
        self.record(ctx, j, ids, sources, alpha)
        return h

    def record(self, ctx, j, ids, sources, alpha, alpha_v=None, two_routes=False):
        """Appends read j's weights when asked; alpha None means a single source (weight 1)."""
        if ctx.record is None:
            return
        def weights(a):
            return sources[0].new_ones(sources[0].shape[:-1] + (1,)) if a is None else a

        ctx.record.append(ReadWeights(j, tuple(ids), weights(alpha), weights(alpha_v) if two_routes else None,
                                      self.config.n_sublayers, self.config.sublayers_per_block))

    def attention_inputs(self, layer, j, ids, sources, rms, ctx):
        """(x_qk, x_v) of an attention sublayer: one route feeds Q, K and V."""
        h = self.read(j, ids, sources, rms, layer.attn_res.query, layer.attn_res.key_norm.weight, ctx)
        x = layer.attn_norm(h)
        return x, x

    def trunk(self, model, emb, ctx):
        c = self.config
        eps, S = c.norm_eps, c.sublayers_per_block
        blocks, block_rms, block_ids = [emb], [_rms(emb, eps)], [EMBEDDING]
        partial = None
        for j in range(c.n_sublayers):
            i, is_mlp = divmod(j, 2)
            layer = model.layers[i]
            if j % S == 0 and j > 0:  # a new block starts: the finished partial sum becomes b_n
                blocks.append(partial)
                block_rms.append(_rms(partial, eps))
                block_ids.append(j - 1)
                partial = None
            sources, rms, ids = list(blocks), list(block_rms), list(block_ids)
            if partial is not None:
                sources.append(partial)
                rms.append(_rms(partial, eps))
                ids.append(j - 1)
            if is_mlp:
                h = self.read(j, ids, sources, rms, layer.mlp_res.query, layer.mlp_res.key_norm.weight, ctx)
                out = layer.mlp(layer.mlp_norm(h))
            else:
                x_qk, x_v = self.attention_inputs(layer, j, ids, sources, rms, ctx)
                out = layer.attn(x_qk, x_v, ctx, i)
            partial = out if partial is None else partial + out  # write-back b_n^i = b_n^{i-1} + f_j
        blocks.append(partial)
        block_rms.append(_rms(partial, eps))
        block_ids.append(c.n_sublayers - 1)
        return self.read(c.n_sublayers, block_ids, blocks, block_rms, model.final_res.query,
                         model.final_res.key_norm.weight, ctx)


class RdAttnRes(BlockAttnRes):
    """`rd` (RD-AttnRes, spec §5): attention sublayers take Q/K from one depth mixture and V from
    another over the same sources, sharing the RMS factors, gamma and the pre-norm weight. The value
    route (`value_route`): decoupled (own query), tied (the Q/K query: equals block), average (one
    input, the mean of both routes), frozen (uniform V route, no parameter)."""

    def attention_inputs(self, layer, j, ids, sources, rms, ctx):
        route = self.config.value_route
        if route == "tied":
            return super().attention_inputs(layer, j, ids, sources, rms, ctx)
        read, norm = layer.attn_res, layer.attn_norm
        gamma = read.key_norm.weight
        if len(sources) == 1:  # both routes put all weight on the only source
            alpha = alpha_v = None
            h = h_v = sources[0]
        else:
            alpha = _alpha(sources, rms, read.query, gamma)
            h = _mix(alpha, sources)
            if route == "frozen":
                alpha_v = torch.full_like(alpha, 1.0 / len(sources))
            else:
                alpha_v = _alpha(sources, rms, read.value_query, gamma)
            h_v = _mix(alpha_v, sources)
        self.record(ctx, j, ids, sources, alpha, alpha_v, two_routes=True)
        if route == "average":
            x = norm(0.5 * (h + h_v))
            return x, x
        return norm(h), norm(h_v)


class HyperConnection(nn.Module):
    """HC module of one sublayer, `hc.{j}.*` (baselines-spec §3.1): A [n, n+1] (column 0: A_m, the read;
    columns 1..n: A_r, the stream mix), B [n] (output weights); dynamic: w_alpha [n+1, d], w_beta [d],
    the scales s_alpha, s_beta and the norm of the streams they read."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        n, d = c.hc_n, c.d_model
        self.A = nn.Parameter(torch.empty(n, n + 1))
        self.B = nn.Parameter(torch.empty(n))
        self.dynamic, self.tanh = c.hc_dynamic, c.hc_tanh
        if c.hc_dynamic:
            self.w_alpha = nn.Parameter(torch.empty(n + 1, d))
            self.w_beta = nn.Parameter(torch.empty(d))
            self.s_alpha = nn.Parameter(torch.empty(1))
            self.s_beta = nn.Parameter(torch.empty(1))
            self.norm = RMSNorm(d, c.norm_eps)

    def coefficients(self, H):
        """H [B, T, n, d] -> alpha [.., n, n+1], beta [.., n] (static: A and B for every token)."""
        if not self.dynamic:
            return self.A, self.B
        hb = self.norm(H)
        za, zb = hb @ self.w_alpha.T, hb @ self.w_beta
        if self.tanh:
            za, zb = torch.tanh(za), torch.tanh(zb)
        return self.s_alpha * za + self.A, self.s_beta * zb + self.B


def sinkhorn(Z, iters: int, order: str):
    """Sinkhorn-Knopp (baselines-spec §4.1): exp(Z - max Z) per matrix, then per iteration columns then
    rows (col_row) or rows then columns (row_col)."""
    M = torch.exp(Z - Z.detach().amax(dim=(-2, -1), keepdim=True))
    for ax in ((-2, -1) if order == "col_row" else (-1, -2)) * iters:  # summing over -2 normalises columns
        M = M / M.sum(dim=ax, keepdim=True)
    return M


class Mhc(nn.Module):
    """mHC module of one sublayer, `mhc.{j}.*` (baselines-spec §4.1): phi [n(n+2), n d], alpha [3]
    (pre, post, res), b [n(n+2)]."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        n = c.mhc_n
        self.n, self.eps, self.iters, self.order, self.pre_eps = (n, c.norm_eps, c.mhc_sinkhorn_iters,
                                                                  c.mhc_sinkhorn_order, c.mhc_pre_eps)
        self.phi = nn.Parameter(torch.empty(n * (n + 2), n * c.d_model))
        self.alpha = nn.Parameter(torch.empty(3))
        self.b = nn.Parameter(torch.empty(n * (n + 2)))

    def coefficients(self, H):
        """H [B, T, n, d] -> H_pre [.., n], H_post [.., n], H_res [.., n, n]."""
        n, v = self.n, H.flatten(-2)
        z = (v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + self.eps)) @ self.phi.T
        pre = torch.sigmoid(self.alpha[0] * z[..., :n] + self.b[:n]) + self.pre_eps
        post = 2 * torch.sigmoid(self.alpha[1] * z[..., n:2 * n] + self.b[n:2 * n])
        res = sinkhorn((self.alpha[2] * z[..., 2 * n:] + self.b[2 * n:]).unflatten(-1, (n, n)), self.iters, self.order)
        return pre, post, res


class StreamResiduals(ResidualMode):
    """`hc` (Hyper-Connections, baselines-spec §3) and `mhc` (§4): n residual streams H [B, T, n, d],
    n copies of the embedding at the start; sublayer j reads h from H with its module, computes
    y = f_j(RMSNorm_j(h)) and writes H <- (mixed streams) + (output weights) y; the exit is the sum
    (or mean) of the streams. At initialisation HC computes pre-norm's function (every stream is
    pre-norm's x; the sum readout scales it by n, which the final norm undoes); mHC starts near it
    through its biases (H_pre sigmoid(+-3), H_res Sinkhorn of 6I - 3)."""

    def decayed(self, name, shape):  # HC's dynamic w_alpha, w_beta and mHC's phi; never A, B, s, alpha, b
        if name.startswith(("hc.", "mhc.")):
            return name.endswith((".w_alpha", ".w_beta", ".phi"))
        return super().decayed(name, shape)

    def __init__(self, config):
        super().__init__(config)
        c = config
        self.hc = c.residual == "hc"
        self.n = c.hc_n if self.hc else c.mhc_n
        self.readout = c.hc_reduce if self.hc else c.mhc_reduce

    def final_params(self):
        c, n, d = self.config, self.n, self.config.d_model
        out = []
        for j in range(c.n_sublayers):
            if self.hc:
                p = f"hc.{j}."
                out += [(p + "A", (n, n + 1)), (p + "B", (n,))]
                if c.hc_dynamic:
                    out += [(p + "w_alpha", (n + 1, d)), (p + "w_beta", (d,)), (p + "s_alpha", (1,)),
                            (p + "s_beta", (1,)), (p + "norm.weight", (d,))]
            else:
                p = f"mhc.{j}."
                out += [(p + "phi", (n * (n + 2), n * d)), (p + "alpha", (3,)), (p + "b", (n * (n + 2),))]
        return out

    def build(self, model):
        modules = nn.ModuleList((HyperConnection if self.hc else Mhc)(self.config)
                                for _ in range(self.config.n_sublayers))
        if self.hc:
            model.hc = modules
        else:
            model.mhc = modules

    def initial_values(self):
        """ParamLayout::add_hyper_connection / add_mhc: HC A_m = e_{j mod n}, A_r = I, B = 1, W = 0,
        s = hc_scale_init; mHC alpha = mhc_alpha_init, b by mhc_bias_init (home_pm3: +3 on the home
        stream of H_pre and -3 elsewhere, 0 for H_post, 6I - 3 for H_res)."""
        c, n, out = self.config, self.n, {}
        for j in range(c.n_sublayers):
            home = j % n
            if self.hc:
                p = f"hc.{j}."
                A = torch.zeros(n, n + 1)
                A[home, 0] = 1.0
                A[:, 1:] = torch.eye(n)
                out[p + "A"], out[p + "B"] = A, torch.ones(n)
                if c.hc_dynamic:
                    out[p + "w_alpha"], out[p + "w_beta"] = torch.zeros(n + 1, c.d_model), torch.zeros(c.d_model)
                    out[p + "s_alpha"] = out[p + "s_beta"] = torch.tensor([c.hc_scale_init])
            else:
                p = f"mhc.{j}."
                b = torch.zeros(n * (n + 2))
                if c.mhc_bias_init == "home_pm3":
                    b[:n] = -3.0
                    b[home] = 3.0
                    b[2 * n:] = (6 * torch.eye(n) - 3).flatten()
                out[p + "alpha"], out[p + "b"] = torch.full((3,), c.mhc_alpha_init), b
        return out

    def init_std(self, name):
        return self.config.mhc_phi_std if name.startswith("mhc.") and name.endswith(".phi") else None

    def trunk(self, model, emb, ctx):
        H = emb.unsqueeze(-2).expand(emb.shape[:-1] + (self.n, emb.shape[-1]))
        modules = model.hc if self.hc else model.mhc
        for j in range(self.config.n_sublayers):
            i, is_mlp = divmod(j, 2)
            layer = model.layers[i]
            if self.hc:
                alpha, beta = modules[j].coefficients(H)
                h = (alpha[..., :, 0:1] * H).sum(-2)
            else:
                pre, post, res = modules[j].coefficients(H)
                h = (pre[..., :, None] * H).sum(-2)
            if is_mlp:
                y = layer.mlp(layer.mlp_norm(h))
            else:
                a = layer.attn_norm(h)
                y = layer.attn(a, a, ctx, i)
            if self.hc:  # H_k <- sum_i alpha[i, k+1] H_i + beta_k y
                H = alpha[..., :, 1:].transpose(-1, -2) @ H + beta[..., :, None] * y[..., None, :]
            else:  # H_i <- sum_k H_res[i, k] H_k + H_post[i] y
                H = res @ H + post[..., :, None] * y[..., None, :]
        return H.sum(-2) if self.readout == "sum" else H.mean(-2)


def mudd_da_shape(c: ModelConfig, i: int) -> Tuple[int, int, int]:
    """(C, S, K) of MUDD's DA module after block i (0-based; ModelConfig::mudd_da_ways / _sources /
    _hidden): ways (4: Q, K, V, R; 1 for mudd_ways = r and the last DA), sources X_0..X_{i+1}, and the
    generator's width C S e rounded up past a multiple of mudd_hidden_round (e = mudd_last_expand for
    the last DA, else 1)."""
    last = i == c.n_layers - 1
    C = 1 if last or c.mudd_ways == "r" else 4
    S = i + 2
    k = C * S * (c.mudd_last_expand if last else 1)
    K = (k // c.mudd_hidden_round + 1) * c.mudd_hidden_round if c.mudd_hidden_round > 0 else k
    return C, S, K


class MuddDa(nn.Module):
    """MUDD's DA module after block i, `mudd.{i}.*` (baselines-spec §2.1-2.2): dynamic: the generator
    w1 [K, d], GELU, w2 [C S, K] gives per-token weights dw [C, S] = W2 GELU(W1 RMSNorm(x)) + a; static:
    dw = a [C, S]. Stream c = sum_s dw[c, s] X_s; with PrePostDANorm the sources are normalised, the
    generator's norm has a weight and the streams are x + mix (R: x + RMSNorm(mix))."""

    def __init__(self, c: ModelConfig, i: int):
        super().__init__()
        C, S, K = mudd_da_shape(c, i)
        self.C, self.S, self.eps = C, S, c.norm_eps
        self.dynamic, self.prepost = c.mudd_dynamic, c.mudd_prepost_norm
        self.gelu = "tanh" if c.mudd_gelu == "tanh" else "none"
        if c.mudd_dynamic:
            self.w1 = nn.Parameter(torch.empty(K, c.d_model))
            self.w2 = nn.Parameter(torch.empty(C * S, K))
        self.a = nn.Parameter(torch.empty(C, S))
        if c.mudd_prepost_norm:
            if c.mudd_dynamic:
                self.gen_norm = RMSNorm(c.d_model, c.norm_eps)
            self.post_norm = RMSNorm(c.d_model, c.norm_eps)

    def forward(self, sources, x):
        """sources: S tensors [B, T, d] (normalised with PrePostDANorm), x: the block output -> C streams, R last."""
        if self.dynamic:
            nx = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
            if self.prepost:
                nx = nx * self.gen_norm.weight
            g = F.gelu(F.linear(nx, self.w1), approximate=self.gelu)
            dw = F.linear(g, self.w2).unflatten(-1, (self.C, self.S)) + self.a
        else:
            dw = self.a
        mix = dw @ torch.stack(sources, -2)  # [B, T, C, d]
        if not self.prepost:
            return list(mix.unbind(-2))
        streams = [x + mix[..., c, :] for c in range(self.C - 1)]
        return streams + [x + self.post_norm(mix[..., self.C - 1, :])]


class Mudd(ResidualMode):
    """`mudd` (MUDDFormer, baselines-spec §2): block i takes its Q, K, V and residual inputs from four
    streams (one with mudd_ways = r), Q, K and V through their own pre-norms (one norm for all without
    mudd_sep_qkv_norm): h = x_R + Attn, X_{i+1} = h + MLP(RMSNorm(h)); the DA module after block i
    mixes X_0..X_{i+1} into the next block's streams, and the last one's R stream feeds the final
    norm. At initialisation every stream is the block output: pre-norm's function, bit for bit."""

    def decayed(self, name, shape):  # the generator's matrices; with mudd_decay_all (the official policy) all
        if name.startswith("mudd."):
            return self.config.mudd_decay_all or name.endswith((".w1", ".w2"))
        return super().decayed(name, shape)

    def final_params(self):
        c, d, out = self.config, self.config.d_model, []
        for i in range(c.n_layers):
            C, S, K = mudd_da_shape(c, i)
            p = f"mudd.{i}."
            if c.mudd_dynamic:
                out += [(p + "w1", (K, d)), (p + "w2", (C * S, K))]
            out += [(p + "a", (C, S))]
            if c.mudd_prepost_norm:
                out += [(p + "gen_norm.weight", (d,))] * c.mudd_dynamic + [(p + "post_norm.weight", (d,))]
        if c.mudd_prepost_norm:
            out += [(f"mudd.src_norm.{s}.weight", (d,)) for s in range(c.n_layers + 1)]
        return out

    def build(self, model):
        c = self.config
        model.mudd = nn.Module()  # mudd.{i}.* (MuddDa), then mudd.src_norm.{s}.weight: ParamLayout's order
        for i in range(c.n_layers):
            model.mudd.add_module(str(i), MuddDa(c, i))
        if c.mudd_prepost_norm:
            model.mudd.src_norm = nn.ModuleList(RMSNorm(c.d_model, c.norm_eps) for _ in range(c.n_layers + 1))

    def initial_values(self):
        """ParamLayout::add_mudd: w2 = 0; a = 1 on the block output (the last source) in every way (0 with
        PrePostDANorm, whose streams are x + the mix); post_norm = 1e-3."""
        c, out = self.config, {}
        for i in range(c.n_layers):
            C, S, K = mudd_da_shape(c, i)
            p = f"mudd.{i}."
            if c.mudd_dynamic:
                out[p + "w2"] = torch.zeros(C * S, K)
            a = torch.zeros(C, S)
            if not c.mudd_prepost_norm:
                a[:, -1] = 1.0
            out[p + "a"] = a
            if c.mudd_prepost_norm:
                out[p + "post_norm.weight"] = torch.full((c.d_model,), 1e-3)
        return out

    def init_std(self, name):
        return 1.0 / math.sqrt(self.config.d_model) if name.startswith("mudd.") and name.endswith(".w1") else None

    def trunk(self, model, emb, ctx):
        c = self.config
        src_norm = model.mudd.src_norm if c.mudd_prepost_norm else None
        X = [src_norm[0](emb) if src_norm is not None else emb]  # the DA's sources (normalised with PrePost)
        x_q = x_k = x_v = x_r = emb
        for i, layer in enumerate(model.layers):
            n_k = layer.attn_norm_k if c.mudd_separate_kv_norms else layer.attn_norm
            n_v = layer.attn_norm_v if c.mudd_separate_kv_norms else layer.attn_norm
            h = x_r + layer.attn(layer.attn_norm(x_q), n_v(x_v), ctx, i, x_k=n_k(x_k))
            x = h + layer.mlp(layer.mlp_norm(h))
            X.append(src_norm[i + 1](x) if src_norm is not None else x)
            streams = getattr(model.mudd, str(i))(X, x)
            if len(streams) == 4:
                x_q, x_k, x_v, x_r = streams
            else:  # R alone (mudd_ways = r, or the last DA): every input of the next block
                x_q = x_k = x_v = x_r = streams[0]
        return x_r


def delta_read_params(c: ModelConfig, read: str, value_route: bool = False) -> List[Tuple[str, Tuple[int, ...]]]:
    """(name, shape) of one Delta AttnRes read (`attn_res` or `mlp_res`), in ParamLayout order
    (docs/delta-gated-spec.md §1.7)."""
    d = (c.d_model,)
    out = [(read + ".query", d), (read + ".key_norm.weight", d)]
    if value_route:
        out += [(read + ".value_query", d), (read + ".value_key_norm.weight", d)]
    if c.delta_null_source:
        out += [(read + ".null_source", d)]
    out += {"none": [], "sigmoid_scalar": [(read + ".gate_logit", (1,))],
            "learnable_alpha": [(read + ".gate_alpha", (1,))],
            "sigmoid_vector": [(read + ".gate.weight", (c.d_model, c.d_model)), (read + ".gate.bias", d)]}[c.delta_gate]
    return out


class DeltaRead(nn.Module):
    """The parameters of one Delta AttnRes read (docs/delta-gated-spec.md §1): pseudo-query (init 0) and
    key-norm weight (init 1) as an AttnRes read; the attention reads' V route (delta_value_route =
    decoupled) has its own query and key norm; a learned null source (init 0); the gate of the correction
    h = x + g c: a logit (sigmoid_scalar, init -2), a factor (learnable_alpha, init 0) or a per-channel
    sigmoid(W x + b) (sigmoid_vector, W = 0, b = -2)."""

    def __init__(self, c: ModelConfig, value_route: bool = False):
        super().__init__()
        d = c.d_model
        self.query = nn.Parameter(torch.zeros(d))
        self.key_norm = RMSNorm(d, c.norm_eps)
        if value_route:
            self.value_query = nn.Parameter(torch.zeros(d))
            self.value_key_norm = RMSNorm(d, c.norm_eps)
        if c.delta_null_source:
            self.null_source = nn.Parameter(torch.zeros(d))
        self.gate_kind = c.delta_gate
        if c.delta_gate == "sigmoid_scalar":
            self.gate_logit = nn.Parameter(torch.full((1,), -2.0))
        elif c.delta_gate == "learnable_alpha":
            self.gate_alpha = nn.Parameter(torch.zeros(1))
        elif c.delta_gate == "sigmoid_vector":
            self.gate = nn.Linear(d, d, bias=True)

    def gate_value(self, x):
        """g of h = x + g c (1 without a gate)."""
        if self.gate_kind == "sigmoid_scalar":
            return torch.sigmoid(self.gate_logit)
        if self.gate_kind == "learnable_alpha":
            return self.gate_alpha
        if self.gate_kind == "sigmoid_vector":
            return torch.sigmoid(F.linear(x, self.gate.weight, self.gate.bias))
        return None


class DeltaAttnRes(ResidualMode):
    """`delta` and `delta_block` (Delta AttnRes, docs/delta-gated-spec.md §1): the pre-norm residual stream
    x_{j+1} = x_j + f_j stays; sublayer j's input is RMSNorm_j(h_j), h_j = x_j + g_j sum_s alpha_s v_s, a
    softmax over the deltas v_s (the embedding from sublayer 1 on, then every earlier sublayer output for
    `delta`, or Block AttnRes's block sums with the current block's partial sum for `delta_block`; with
    delta_block_partial = false the released code's schedule: completed blocks only, each from the sublayer
    after the next block's first) with an optional learned null source first. No final read: the final norm
    reads x_L. At zero queries every read adds the mean of its sources, x_j / n, so the model computes
    pre-norm's function up to epsilon."""

    def decayed(self, name, shape):  # the reads' parameters with delta_decay_all (the released code's
        if ".attn_res." in name or ".mlp_res." in name:  # policy); else only the vector gates' matrices
            return self.config.delta_decay_all or len(shape) == 2
        return super().decayed(name, shape)

    def __init__(self, config):
        super().__init__(config)
        self.decoupled = config.delta_value_route == "decoupled"

    def layer_params(self, layer):
        c = self.config
        return delta_read_params(c, "attn_res", self.decoupled) + delta_read_params(c, "mlp_res")

    def build(self, model):
        for layer in model.layers:
            layer.attn_res = DeltaRead(self.config, value_route=self.decoupled)
            layer.mlp_res = DeltaRead(self.config)

    def initial_values(self):
        c, d, out = self.config, self.config.d_model, {}
        for i in range(c.n_layers):
            for read in ("attn_res", "mlp_res"):
                p = f"layers.{i}.{read}."
                if c.delta_null_source:
                    out[p + "null_source"] = torch.zeros(d)
                if c.delta_gate == "sigmoid_scalar":
                    out[p + "gate_logit"] = torch.tensor([-2.0])
                elif c.delta_gate == "learnable_alpha":
                    out[p + "gate_alpha"] = torch.zeros(1)
                elif c.delta_gate == "sigmoid_vector":
                    out[p + "gate.weight"] = torch.zeros(d, d)
                    out[p + "gate.bias"] = torch.full((d,), -2.0)
        return out

    def trunk(self, model, emb, ctx):
        c = self.config
        eps, S = c.norm_eps, c.sublayers_per_block
        partial_mode = c.residual == "delta" or c.delta_block_partial
        emb_rms = _rms(emb, eps)
        done, done_rms, done_ids = [], [], []  # completed block sums (for `delta`: the sublayer outputs)
        x, partial = emb, None
        for j in range(c.n_sublayers):
            i, is_mlp = divmod(j, 2)
            layer = model.layers[i]
            read = layer.mlp_res if is_mlp else layer.attn_res
            sources, rms, ids = [], [], []
            if j > 0:
                n_done = len(done) if partial_mode else (j - 1) // S
                sources, rms = [emb] + done[:n_done], [emb_rms] + done_rms[:n_done]
                ids = [EMBEDDING] + done_ids[:n_done]
                if partial_mode and partial is not None:
                    sources, rms, ids = sources + [partial], rms + [_rms(partial, eps)], ids + [j - 1]
            if c.delta_null_source:
                null = read.null_source.expand_as(x)
                sources, rms, ids = [null] + sources, [_rms(read.null_source, eps)] + rms, [NULL_SOURCE] + ids
            h = h_v = x
            if sources:
                g = read.gate_value(x)
                alpha = _alpha(sources, rms, read.query, read.key_norm.weight)
                corr = _mix(alpha, sources)
                h = x + (corr if g is None else g * corr)
                alpha_v = None
                if self.decoupled and not is_mlp:
                    alpha_v = _alpha(sources, rms, read.value_query, read.value_key_norm.weight)
                    corr_v = _mix(alpha_v, sources)
                    h_v = x + (corr_v if g is None else g * corr_v)
                else:
                    h_v = h
                if ctx.record is not None:
                    ctx.record.append(ReadWeights(j, tuple(ids), alpha, alpha_v, c.n_sublayers, S, mixer="delta"))
            if is_mlp:
                out = layer.mlp(layer.mlp_norm(h))
            else:
                a = layer.attn_norm(h)
                out = layer.attn(a, a if h_v is h else layer.attn_norm(h_v), ctx, i)
            x = x + out
            partial = out if partial is None else partial + out
            if (j + 1) % S == 0:  # the block is complete
                done.append(partial)
                done_rms.append(_rms(partial, eps))
                done_ids.append(j)
                partial = None
        return x


class ZeroCentredNorm(nn.Module):
    """The weight of a zero-centred (Gemma / Qwen3-Next style) RMSNorm, applied as 1 + weight; init 0."""

    def __init__(self, size: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size))


class GatedResidual(nn.Module):
    """One Gated Residual module, `gr.{j}.*` or `gr_final.*` (docs/delta-gated-spec.md §2): norm.weight
    [n d] (zero-centred), w_down [r, n d], w_up [n d, r], and for the sublayers' modules w_inject [n, n d]."""

    def __init__(self, c: ModelConfig, write: bool = True):
        super().__init__()
        n, d, r = c.gr_n, c.d_model, c.gr_bottleneck
        self.n, self.d, self.eps = n, d, c.norm_eps
        self.norm = ZeroCentredNorm(n * d)
        self.w_down = nn.Parameter(torch.empty(r, n * d))
        self.w_up = nn.Parameter(torch.empty(n * d, r))
        if write:
            self.w_inject = nn.Parameter(torch.empty(n, n * d))

    def read(self, H):
        """H [B, T, n, d] -> (x = mean_i G_i * Hn_i [B, T, d], Hn, G): Hn_i = RMSNorm(H_i) (1 + w_i),
        G = sigmoid(W_up silu(W_down vec(Hn) / n))."""
        scale = 1.0 + self.norm.weight.view(self.n, self.d)
        Hn = H * torch.rsqrt(H.pow(2).mean(-1, keepdim=True) + self.eps) * scale
        flat = Hn.flatten(-2)
        G = torch.sigmoid(F.linear(F.silu(F.linear(flat, self.w_down) / self.n), self.w_up))
        G = G.unflatten(-1, (self.n, self.d))
        return (G * Hn).mean(-2), Hn, G

    def write(self, H, Hn, y):
        """H_i + beta_i y with beta = 2 sigmoid(W_inject vec(Hn) / n): (H', beta [B, T, n])."""
        beta = 2 * torch.sigmoid(F.linear(Hn.flatten(-2), self.w_inject) / self.n)
        return H + beta[..., :, None] * y[..., None, :], beta


class GatedResidualMode(ResidualMode):
    """`gr` (the Gated Residual of Qwen3.8-Flash-Next, docs/delta-gated-spec.md §2): gr_n branches, n copies
    of the embedding at the start; sublayer j's input is its module's read x = mean_i G_i * Hn_i (which
    replaces its pre-norm), its output y is written to every branch with a per-branch gate,
    H_i <- H_i + beta_i y; no mixing between branches. The final mixer's read feeds the LM head (no final
    norm). With W_up = 0, W_inject = 0 and the norms at 0, pre-norm's function with every norm weight 1/2."""

    def decayed(self, name, shape):  # the matrices; the zero-centred norms too with gr_decay_norm
        if name.startswith(("gr.", "gr_final.")):
            return len(shape) == 2 or self.config.gr_decay_norm
        return super().decayed(name, shape)

    def final_params(self):
        c, n, d, r = self.config, self.config.gr_n, self.config.d_model, self.config.gr_bottleneck
        out = []
        for j in range(c.n_sublayers):
            p = f"gr.{j}."
            out += [(p + "norm.weight", (n * d,)), (p + "w_down", (r, n * d)), (p + "w_up", (n * d, r)),
                    (p + "w_inject", (n, n * d))]
        return out + [("gr_final.norm.weight", (n * d,)), ("gr_final.w_down", (r, n * d)),
                      ("gr_final.w_up", (n * d, r))]

    def build(self, model):
        model.gr = nn.ModuleList(GatedResidual(self.config) for _ in range(self.config.n_sublayers))
        model.gr_final = GatedResidual(self.config, write=False)

    def initial_values(self):
        c = self.config
        size = (c.gr_n * c.d_model,)
        out = {f"gr.{j}.norm.weight": torch.zeros(size) for j in range(c.n_sublayers)}
        out["gr_final.norm.weight"] = torch.zeros(size)
        return out

    def trunk(self, model, emb, ctx):
        c, n = self.config, self.config.gr_n
        H = emb.unsqueeze(-2).expand(emb.shape[:-1] + (n, emb.shape[-1]))
        branches = tuple(range(n))
        for j in range(c.n_sublayers):
            i, is_mlp = divmod(j, 2)
            layer, module = model.layers[i], model.gr[j]
            x, Hn, G = module.read(H)
            y = layer.mlp(x) if is_mlp else layer.attn(x, x, ctx, i)
            H, beta = module.write(H, Hn, y)
            if ctx.record is not None:
                ctx.record.append(ReadWeights(j, branches, G.mean(-1), beta, c.n_sublayers, 1, mixer="gr"))
        x, _, G = model.gr_final.read(H)
        if ctx.record is not None:
            ctx.record.append(ReadWeights(c.n_sublayers, branches, G.mean(-1), None, c.n_sublayers, 1, mixer="gr"))
        return x


def routing_max_weight(reads: List[ReadWeights], single_source: bool = False) -> Tuple[Dict[int, float], float]:
    """Delta AttnRes's routing-collapse statistic (docs/delta-gated-spec.md §1.8): for every softmax read
    (AttnRes or Delta AttnRes; route 0), the mean over tokens of its largest weight, and the mean of those
    over the reads. Reads with a single source (weight 1) count only with single_source. The paper reports
    about 0.2 for AttnRes's cumulative sources in deep layers and about 0.6 for deltas."""
    per_read = {r.read: r.qk.detach().max(-1).values.double().mean().item() for r in reads
                if r.mixer in ("softmax", "delta") and (single_source or r.qk.shape[-1] > 1)}
    return per_read, (sum(per_read.values()) / len(per_read) if per_read else float("nan"))


MODES = {"prenorm": PreNorm, "full": BlockAttnRes, "block": BlockAttnRes, "rd": RdAttnRes,
         "denseformer": DenseFormer, "hc": StreamResiduals, "mhc": StreamResiduals, "mudd": Mudd,
         "delta": DeltaAttnRes, "delta_block": DeltaAttnRes, "gr": GatedResidualMode}


def residual_mode(config: ModelConfig) -> ResidualMode:
    try:
        return MODES[config.residual](config)
    except KeyError:
        raise ValueError(f"residual mode '{config.residual}' has no PyTorch implementation "
                         f"(known: {', '.join(MODES)})") from None


def param_layout(config: ModelConfig) -> List[Tuple[str, Tuple[int, ...]]]:
    """Every parameter (name, shape) in the order of src/model/param_layout.cpp: the order of the flat
    `params` tensor of a checkpoint-STEP.safetensors."""
    c, mode = config, residual_mode(config)
    d, h, V = c.d_model, c.mlp_hidden, c.vocab_size
    out = [("tok_emb.weight", (V, d))]
    for i in range(c.n_layers):
        p = f"layers.{i}."
        out += [(p + "attn_norm.weight", (d,))] * c.has_prenorm
        if c.mudd_separate_kv_norms:
            out += [(p + "attn_norm_k.weight", (d,)), (p + "attn_norm_v.weight", (d,))]
        out += [(p + f"attn.{w}.weight", (d, d)) for w in ("wq", "wk", "wv", "wo")]
        if i >= 1 and c.vres_parameters > 0:  # the first attention layer keeps its own values
            out += [(p + "attn.vres_lambda", (c.vres_parameters,))]
        out += [(p + "mlp_norm.weight", (d,))] * c.has_prenorm
        out += [(p + "mlp.w_gate.weight", (h, d)), (p + "mlp.w_up.weight", (h, d)),
                (p + "mlp.w_down.weight", (d, h))]
        out += [(p + name, shape) for name, shape in mode.layer_params(i)]
    out += mode.final_params()
    out += [("final_norm.weight", (d,))] * c.has_prenorm
    if not c.tie_embeddings:
        out += [("lm_head.weight", (V, d))]
    return out


def weight_decayed(config: ModelConfig, name: str, shape: Tuple[int, ...]) -> bool:
    """Whether attnres's AdamW decays a parameter (ParamInfo::decay): the matrices and whatever the
    config's residual family decides for its own parameters (its ResidualMode's decayed: DenseFormer's
    DWA weights when dwa_weight_decay, HC's dynamic w_alpha and w_beta and mHC's phi (not HC's A);
    Delta AttnRes's read parameters when delta_decay_all; GR's matrices (and its zero-centred norms
    when gr_decay_norm); MUDD's generator, all of mudd.* with mudd_decay_all); never other norm
    weights, queries, value-residual lambdas or the HC / mHC scalars and biases."""
    return residual_mode(config).decayed(name, shape)


# ------------------------------------------------------------------------------------------------
# the model
# ------------------------------------------------------------------------------------------------
class AttnResModel(nn.Module):
    """attnres's decoder-only LM. ``model(ids)`` -> logits [B, T, vocab]; with ``return_weights=True``
    also the depth weights of every read (a list of ReadWeights indexed by read; empty for prenorm)."""

    def __init__(self, config: ModelConfig, *, dtype=torch.float32, device=None, seed: int = 0):
        super().__init__()
        self.config = config.validate()
        self.mode = residual_mode(config)
        c = config
        vres = ValueResidual(c) if c.value_residual else None
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.layers = nn.ModuleList(Layer(c, i, vres) for i in range(c.n_layers))
        self.mode.build(self)
        if c.has_prenorm:  # GR's final mixer replaces the final norm
            self.final_norm = RMSNorm(c.d_model, c.norm_eps)
        if not c.tie_embeddings:
            self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.tokenizer_spec: Optional[str] = None  # set by attnres.load from the checkpoint's metadata
        self.metadata: Dict[str, str] = {}
        self._table_cache: dict = {}
        self.init_weights(seed)
        self.to(dtype=dtype, device=device)

    @torch.no_grad()
    def init_weights(self, seed: int = 0) -> None:
        """The project's initialisation scheme (docs/model.md) with torch's generator (not the C++
        values): matrices N(0, 0.02), wo and w_down N(0, 0.02/sqrt(2 n_layers)), norm and key-norm
        weights 1, pseudo-queries 0, DWA weights the identity (1 on the block's own output, last),
        value-residual lambdas (vres_lambda1, vres_lambda2)[:n], the HC and mHC modules as
        StreamResiduals.initial_values (mHC's phi N(0, mhc_phi_std)), Delta AttnRes's null sources,
        gates and GR's zero-centred norms as their modes' initial_values (GR's matrices N(0, 0.02))."""
        g = torch.Generator().manual_seed(seed)
        std_out = 0.02 / math.sqrt(2 * self.config.n_layers)
        fixed = self.mode.initial_values()
        for name, p in self.named_parameters():
            if name in fixed:
                p.copy_(fixed[name])
            elif p.dim() == 2:
                std = self.mode.init_std(name)
                if std is None:
                    std = std_out if name.endswith(("wo.weight", "w_down.weight")) else 0.02
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * std)
            elif name.endswith("query"):
                p.zero_()
            elif name.endswith("attn.vres_lambda"):
                p.copy_(torch.tensor(ValueResidual(self.config).initial()))
            elif name.startswith("dwa."):
                p.zero_()
                p[-1] = 1.0
            else:
                p.fill_(1.0)

    ATTENTIONS = ("matmul", "sdpa")

    def set_attention(self, kind: str) -> "AttnResModel":
        """How attention is computed without a KV cache: "matmul" (matmul, additive mask, softmax,
        matmul; the default, any torch) or "sdpa" (F.scaled_dot_product_attention, torch >= 2.1).
        Decoding with a KVCache always uses "matmul". Returns the model."""
        if kind not in self.ATTENTIONS:
            raise ValueError(f"attention '{kind}': expected one of {', '.join(self.ATTENTIONS)}")
        if kind == "sdpa" and not sdpa_available():
            raise RuntimeError(f"attention 'sdpa' needs F.scaled_dot_product_attention with a scale argument "
                               f"(torch >= 2.1); this is torch {torch.__version__}")
        for layer in self.layers:
            layer.attn.sdpa = kind == "sdpa"
        return self

    def _tables(self, dtype, device):
        """RoPE cos/sin [max_seq_len, head_dim] (computed in float64) and the additive causal mask."""
        key = (dtype, device)
        if key not in self._table_cache:
            c = self.config
            hd = c.head_dim
            inv_freq = c.rope_theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
            ang = torch.arange(c.max_seq_len, dtype=torch.float64)[:, None] * inv_freq[None, :]
            cos = torch.cat([ang.cos(), ang.cos()], -1).to(dtype=dtype, device=device)
            sin = torch.cat([ang.sin(), ang.sin()], -1).to(dtype=dtype, device=device)
            mask = torch.full((c.max_seq_len, c.max_seq_len), float("-inf"), dtype=dtype, device=device).triu(1)
            self._table_cache[key] = (cos, sin, mask)
        return self._table_cache[key]

    def _apply(self, fn):  # .to() / .double() / .cuda(): the tables follow the parameters
        self._table_cache = {}
        return super()._apply(fn)

    @property
    def head_weight(self):
        return self.tok_emb.weight if self.config.tie_embeddings else self.lm_head.weight

    def hidden(self, input_ids, *, cache: Optional[KVCache] = None, record=None):
        """The final-normalised hidden state [B, T, d] (before the LM head)."""
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [batch, seq], got shape {list(input_ids.shape)}")
        T = input_ids.shape[1]
        start = cache.length if cache is not None else 0
        if start + T > self.config.max_seq_len:
            raise ValueError(f"sequence of {start + T} positions exceeds max_seq_len {self.config.max_seq_len}")
        if cache is not None and start + T > cache.max_seq:
            raise ValueError(f"the context is full ({cache.max_seq} tokens)")
        ctx = _Pass(self, T, start, cache, record)
        x = self.mode.trunk(self, self.tok_emb(input_ids), ctx)
        if cache is not None:
            cache.length += T
        return self.final_norm(x) if self.config.has_prenorm else x

    def forward(self, input_ids, *, return_weights: bool = False, cache: Optional[KVCache] = None):
        """input_ids: int64 [B, T] -> logits [B, T, vocab]; with a cache, the positions continue at
        cache.length. return_weights: also return the list of ReadWeights (one per read)."""
        record = [] if return_weights else None
        logits = F.linear(self.hidden(input_ids, cache=cache, record=record), self.head_weight)
        return (logits, record) if return_weights else logits

    def loss(self, tokens):
        """Mean next-token cross-entropy (nats) of int64 tokens [B, T+1], as Model::forward."""
        logits = self(tokens[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))

    def new_cache(self, batch: int = 1, max_seq: Optional[int] = None) -> KVCache:
        w = self.tok_emb.weight
        return KVCache(self.config, batch, max_seq, dtype=w.dtype, device=w.device)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def extra_repr(self) -> str:
        c = self.config
        route = f", value_route={c.value_route}" if c.residual == "rd" else ""
        blocks = f", n_blocks={c.n_blocks}" if c.residual in ("block", "rd", "delta_block") else ""
        dwa = f", dwa={c.dwa_dilation}x{c.dwa_period}" if c.residual == "denseformer" else ""
        dwa += f", hc_n={c.hc_n}, dynamic={c.hc_dynamic}" if c.residual == "hc" else ""
        dwa += f", mhc_n={c.mhc_n}" if c.residual == "mhc" else ""
        dwa += f", mudd_ways={c.mudd_ways}, dynamic={c.mudd_dynamic}" if c.residual == "mudd" else ""
        dwa += f", delta_gate={c.delta_gate}, null_source={c.delta_null_source}" if c.residual in DELTA_MODES else ""
        dwa += f", gr_n={c.gr_n}, gr_rank={c.gr_bottleneck}" if c.residual == "gr" else ""
        vres = f", value_residual={c.vres_mode}" if c.value_residual else ""
        return f"residual={c.residual}{blocks}{route}{dwa}{vres}, params={self.num_params():,}"
