"""The model's hyper-parameters, as src/model/config.{hpp,cpp} defines them.

A checkpoint carries its config as JSON under the safetensors metadata key ``config``; this module
reads it with the same strictness as the C++ (unknown keys and wrong types are errors naming the
key) and checks the same constraints, so a config this package accepts is one `attnres` accepts.
No torch here: reading a config or an experiment does not need it.
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Mapping, Union

RESIDUALS = ("prenorm", "full", "block", "rd", "denseformer", "hc", "mhc", "mudd", "delta", "delta_block", "gr")
DELTA_MODES = ("delta", "delta_block")  # Delta AttnRes (docs/delta-gated-spec.md §1)
DELTA_GATES = ("none", "sigmoid_scalar", "sigmoid_vector", "learnable_alpha")
DELTA_VALUE_ROUTES = ("none", "decoupled")
# Keys that apply to some modes only: a non-default value with another mode is refused, naming the key
# and the mode (src/model/config.cpp's check_mode_keys is the same list). Written always, as the C++
# writes every key.
MODE_KEYS = {"delta_null_source": DELTA_MODES, "delta_gate": DELTA_MODES, "delta_value_route": DELTA_MODES,
             "delta_block_partial": ("delta_block",), "delta_decay_all": DELTA_MODES,
             "gr_n": ("gr",), "gr_rank": ("gr",), "gr_decay_norm": ("gr",)}
MUDD_WAYS = ("qkvr", "r")
GELUS = ("erf", "tanh")
VALUE_ROUTES = ("decoupled", "tied", "average", "frozen")
STREAM_READOUTS = ("sum", "mean")  # hc_reduce, mhc_reduce
SINKHORN_ORDERS = ("col_row", "row_col")
MHC_BIAS_INITS = ("home_pm3", "zero")
MAX_STREAMS = 8  # kernels::kMaxStreams (src/kernels/streams.hpp)
VRES_MODES = ("fixed", "learned_convex", "learned_pair", "constant")
VRES_PARAMETERS = {"fixed": 0, "learned_convex": 1, "learned_pair": 2, "constant": 0}  # per layer after the first
MAX_HEAD_DIM = 256  # kernels::kMaxHeadDim (src/kernels/attention.hpp)
MAX_SOURCES = 256  # kernels::kMaxSources (src/kernels/depth_read.hpp): 2 * n_layers + 1 at most


def _unknown_residual(residual) -> str:
    return f"unknown residual mode '{residual}' (expected {', '.join(RESIDUALS)})"


class ConfigError(ValueError):
    """A model config that attnres would refuse; the message names the source and the key."""


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Field names, defaults and meaning as in src/model/config.hpp (docs/model.md)."""

    vocab_size: int = 257
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 2
    mlp_hidden: int = 320
    residual: str = "block"
    n_blocks: int = 2  # Block AttnRes blocks; `full` uses 2 * n_layers
    value_route: str = "decoupled"  # rd only
    tie_embeddings: bool = True
    norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_seq_len: int = 256
    dwa_dilation: int = 1  # denseformer (baselines-spec §1)
    dwa_period: int = 1
    dwa_weight_decay: bool = True
    value_residual: bool = False  # ResFormer value residual (baselines-spec §5), any mode
    vres_mode: str = "fixed"
    vres_lambda1: float = 0.5
    vres_lambda2: float = 0.5
    # Hyper-connections and mHC (baselines-spec §3-4; residual "hc" / "mhc").
    hc_n: int = 4
    hc_dynamic: bool = True
    hc_tanh: bool = True
    hc_scale_init: float = 0.01
    hc_reduce: str = "sum"
    mhc_n: int = 4
    mhc_sinkhorn_iters: int = 20
    mhc_sinkhorn_order: str = "col_row"
    mhc_alpha_init: float = 0.01
    mhc_phi_std: float = 0.02
    mhc_bias_init: str = "home_pm3"
    mhc_pre_eps: float = 0.0
    mhc_reduce: str = "sum"
    mudd_ways: str = "qkvr"  # mudd (MUDDFormer, baselines-spec §2)
    mudd_dynamic: bool = True
    mudd_hidden_round: int = 64
    mudd_last_expand: int = 4
    mudd_gelu: str = "erf"
    mudd_sep_qkv_norm: bool = True
    mudd_prepost_norm: bool = False
    mudd_decay_all: bool = True
    # Delta AttnRes (residual "delta" / "delta_block") and the Gated Residual ("gr"), docs/delta-gated-spec.md.
    delta_null_source: bool = False
    delta_gate: str = "none"
    delta_value_route: str = "none"
    delta_block_partial: bool = True
    delta_decay_all: bool = True
    gr_n: int = 4
    gr_rank: int = 0  # 0: d_model / 8
    gr_decay_norm: bool = False

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def n_sublayers(self) -> int:
        return 2 * self.n_layers

    @property
    def effective_blocks(self) -> int:
        """Blocks the depth reads use: one per sublayer for `full`, one for `prenorm`."""
        if self.residual in ("prenorm", "denseformer"):
            return 1
        if self.residual in ("full", "delta"):
            return self.n_sublayers
        return self.n_blocks

    @property
    def sublayers_per_block(self) -> int:
        return self.n_sublayers // self.effective_blocks

    @property
    def uses_depth_reads(self) -> bool:
        return self.residual in ("full", "block", "rd")

    @property
    def has_prenorm(self) -> bool:
        """Whether sublayers have their own pre-norm and the model a final norm (GR's reads replace them)."""
        return self.residual != "gr"

    @property
    def gr_bottleneck(self) -> int:
        """The GR read gate's rank: gr_rank, or d_model / 8 (at least 1) when 0."""
        return self.gr_rank if self.gr_rank > 0 else max(1, self.d_model // 8)

    @property
    def has_value_query(self) -> bool:
        return self.residual == "rd" and self.value_route in ("decoupled", "average")

    @property
    def vres_parameters(self) -> int:
        """Learned value-residual scalars per attention layer after the first (0 without value_residual)."""
        return VRES_PARAMETERS[self.vres_mode] if self.value_residual else 0

    @property
    def mudd_separate_kv_norms(self) -> bool:
        """MUDD with four ways and mudd_sep_qkv_norm: K and V have pre-norms of their own (attn_norm_k, _v)."""
        return self.residual == "mudd" and self.mudd_ways == "qkvr" and self.mudd_sep_qkv_norm

    @property
    def route(self) -> str:
        """How attention sublayers read: `tied` (one route) unless this is rd."""
        return self.value_route if self.residual == "rd" else "tied"

    def validate(self, where: str = "model config") -> "ModelConfig":
        def require(ok: bool, message: str) -> None:
            if not ok:
                raise ConfigError(f"{where}: {message}")

        require(self.residual in RESIDUALS, _unknown_residual(self.residual))
        require(self.value_route in VALUE_ROUTES,
                f"unknown value route '{self.value_route}' (expected {', '.join(VALUE_ROUTES)})")
        require(self.vres_mode in VRES_MODES,
                f"unknown value '{self.vres_mode}' of vres_mode (expected {', '.join(VRES_MODES)})")
        require(self.dwa_dilation >= 1 and self.dwa_period >= 1, "dwa_dilation and dwa_period must be at least 1")
        require(self.mudd_ways in MUDD_WAYS,
                f"unknown value '{self.mudd_ways}' of mudd_ways (expected {', '.join(MUDD_WAYS)})")
        require(self.mudd_gelu in GELUS, f"unknown value '{self.mudd_gelu}' of mudd_gelu (expected {', '.join(GELUS)})")
        require(self.mudd_hidden_round >= 0, f"mudd_hidden_round must be at least 0 (got {self.mudd_hidden_round})")
        require(self.mudd_last_expand >= 1, f"mudd_last_expand must be at least 1 (got {self.mudd_last_expand})")
        require(1 <= self.hc_n <= MAX_STREAMS, f"hc_n must be 1 to {MAX_STREAMS} (got {self.hc_n})")
        require(1 <= self.mhc_n <= MAX_STREAMS, f"mhc_n must be 1 to {MAX_STREAMS} (got {self.mhc_n})")
        for key in ("hc_reduce", "mhc_reduce"):
            require(getattr(self, key) in STREAM_READOUTS,
                    f"unknown value '{getattr(self, key)}' of {key} (expected {', '.join(STREAM_READOUTS)})")
        require(self.mhc_sinkhorn_order in SINKHORN_ORDERS, f"unknown value '{self.mhc_sinkhorn_order}' of "
                f"mhc_sinkhorn_order (expected {', '.join(SINKHORN_ORDERS)})")
        require(self.mhc_bias_init in MHC_BIAS_INITS, f"unknown value '{self.mhc_bias_init}' of mhc_bias_init "
                f"(expected {', '.join(MHC_BIAS_INITS)})")
        require(self.mhc_sinkhorn_iters >= 1, f"mhc_sinkhorn_iters must be at least 1 (got {self.mhc_sinkhorn_iters})")
        require(self.mhc_phi_std >= 0, f"mhc_phi_std must be at least 0 (got {self.mhc_phi_std})")
        require(self.mhc_pre_eps >= 0, f"mhc_pre_eps must be at least 0 (got {self.mhc_pre_eps})")
        for key, modes in MODE_KEYS.items():
            value, default = getattr(self, key), self.__dataclass_fields__[key].default
            require(value == default or self.residual in modes,
                    f"model config key '{key}' = {json.dumps(value)} applies to residual "
                    f"{' or '.join(repr(m) for m in modes)}, not to residual mode '{self.residual}'")
        require(self.delta_gate in DELTA_GATES,
                f"unknown value '{self.delta_gate}' of delta_gate (expected {', '.join(DELTA_GATES)})")
        require(self.delta_value_route in DELTA_VALUE_ROUTES, f"unknown value '{self.delta_value_route}' of "
                f"delta_value_route (expected {', '.join(DELTA_VALUE_ROUTES)})")
        require(2 <= self.gr_n <= MAX_STREAMS, f"gr_n must be 2 to {MAX_STREAMS} (got {self.gr_n})")
        require(self.gr_rank >= 0, f"gr_rank must be at least 0 (got {self.gr_rank})")
        require(self.vocab_size >= 2, f"vocab_size must be at least 2 (got {self.vocab_size})")
        require(self.d_model >= 2, f"d_model must be at least 2 (got {self.d_model})")
        require(self.n_layers >= 1, f"n_layers must be at least 1 (got {self.n_layers})")
        require(self.n_heads >= 1 and self.d_model % self.n_heads == 0,
                f"n_heads ({self.n_heads}) must divide d_model ({self.d_model})")
        require(self.head_dim % 2 == 0, f"head_dim = d_model / n_heads must be even for RoPE (got {self.head_dim})")
        require(self.head_dim <= MAX_HEAD_DIM, f"head_dim = d_model / n_heads must be at most {MAX_HEAD_DIM} "
                f"(got {self.head_dim})")
        require(self.n_sublayers + 1 <= MAX_SOURCES,
                f"n_layers is too large for depth reads (at most {(MAX_SOURCES - 1) // 2}, got {self.n_layers})")
        require(self.mlp_hidden >= 1, f"mlp_hidden must be at least 1 (got {self.mlp_hidden})")
        require(self.norm_eps >= 0, "norm_eps must be non-negative")
        require(self.rope_theta > 0, f"rope_theta must be positive (got {self.rope_theta})")
        require(self.max_seq_len >= 1, f"max_seq_len must be at least 1 (got {self.max_seq_len})")
        if self.residual in ("block", "rd", "delta_block"):
            L, N = self.n_sublayers, self.n_blocks
            require(1 <= N <= L and L % N == 0,
                    f"n_blocks ({N}) must divide the number of sublayers 2*n_layers = {L}")
            require(N == L or (L // N) % 2 == 0,
                    f"n_blocks ({N}) must give blocks of an even number of sublayers "
                    f"(blocks start at attention sublayers), or equal {L}")
        return self

    def to_json(self) -> dict:
        """The JSON object attnres writes (same keys, same order)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, value: Union[str, bytes, Mapping[str, Any]], where: str = "model config") -> "ModelConfig":
        """Strict, like model_config_from_json: unknown keys and wrong types are errors."""
        if isinstance(value, (str, bytes)):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise ConfigError(f"{where}: model config is not valid JSON: {e}") from None
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: model config must be a JSON object")
        residual = value.get("residual")
        if isinstance(residual, str) and residual not in RESIDUALS:
            # Before the keys: a mode this package does not know brings keys it does not know either
            # (a newer attnres's), and the mode is the error worth naming.
            raise ConfigError(f"{where}: {_unknown_residual(residual)}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        kwargs = {}
        for key, v in value.items():
            if key not in fields:
                raise ConfigError(f"{where}: unknown model config key '{key}'")
            kind = fields[key].type
            if kind == "bool":
                if not isinstance(v, bool):
                    raise ConfigError(f"{where}: model config key '{key}' must be true or false")
            elif kind == "int":
                if isinstance(v, bool) or not isinstance(v, int):
                    raise ConfigError(f"{where}: model config key '{key}' must be an integer")
            elif kind == "float":
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                    raise ConfigError(f"{where}: model config key '{key}' must be a finite number")
                v = float(v)
            elif not isinstance(v, str):
                raise ConfigError(f"{where}: model config key '{key}' must be a string")
            kwargs[key] = v
        return cls(**kwargs).validate(where)

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes).validate()
