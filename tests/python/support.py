"""Shared helpers of the Python package's tests: where things are, running the attnres CLI, and the
synthetic data and tiny models the CLI tests train (as tests/common/cli_util.hpp does for C++)."""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.environ.get("ATTNRES_SOURCE_DIR", os.path.normpath(os.path.join(HERE, os.pardir, os.pardir)))
sys.path.insert(0, os.path.join(SOURCE_DIR, "python"))
sys.path.insert(0, os.path.join(SOURCE_DIR, "tests", "reference"))

BINARY = os.environ.get("ATTNRES_BINARY", os.path.join(SOURCE_DIR, "build", "src", "cli", "attnres"))
CPP_FORWARD = os.environ.get("ATTNRES_CPP_FORWARD",
                             os.path.join(SOURCE_DIR, "build", "tests", "python", "attnres_cpp_forward"))
SHARED_DATA = os.environ.get("ATTNRES_SHARED_DATA", os.path.join(SOURCE_DIR, os.pardir, "shared", "data"))

# Every residual mode and control: (name, residual, value_route), as tests/common/model_util.hpp.
VARIANTS = [("prenorm", "prenorm", "decoupled"), ("full", "full", "decoupled"), ("block", "block", "decoupled"),
            ("rd", "rd", "decoupled"), ("rd_tied", "rd", "tied"), ("rd_average", "rd", "average"),
            ("rd_frozen", "rd", "frozen")]

# The baselines (baselines-spec §1, §5): (name, model config settings). DenseFormer 1 x 1, 2 x 2 and 4 x 5
# (10 layers: DWAs after blocks 5 and 10, reading [1, 5] and [2, 6, 10]); the value residual in every
# vres_mode (learned ones from their defaults and from other initial values) and with prenorm, block, rd and
# denseformer.
BASELINES = [("denseformer", dict(residual="denseformer")),
             ("denseformer_2x2", dict(residual="denseformer", dwa_dilation=2, dwa_period=2)),
             ("denseformer_4x5", dict(residual="denseformer", dwa_dilation=4, dwa_period=5, n_layers=10)),
             ("prenorm_vres_fixed", dict(residual="prenorm", value_residual=True)),
             ("prenorm_vres_convex", dict(residual="prenorm", value_residual=True, vres_mode="learned_convex",
                                          vres_lambda1=0.75)),
             ("prenorm_vres_pair", dict(residual="prenorm", value_residual=True, vres_mode="learned_pair")),
             ("block_vres_constant", dict(residual="block", value_residual=True, vres_mode="constant",
                                          vres_lambda1=2.0, vres_lambda2=-0.5)),
             ("rd_vres_convex", dict(residual="rd", value_residual=True, vres_mode="learned_convex")),
             ("rd_average_vres_pair", dict(residual="rd", value_route="average", value_residual=True,
                                           vres_mode="learned_pair", vres_lambda1=0.25, vres_lambda2=0.875)),
             ("denseformer_vres_pair", dict(residual="denseformer", value_residual=True, vres_mode="learned_pair")),
             # Hyper-connections (§3) and mHC (§4): dynamic and static, tanh off with the mean readout, 3 streams;
             # Sinkhorn in both orders, the mean readout, H_pre's epsilon, with the value residual.
             ("hc", dict(residual="hc")),
             ("hc_static", dict(residual="hc", hc_dynamic=False)),
             ("hc_linear_mean_n3", dict(residual="hc", hc_tanh=False, hc_reduce="mean", hc_n=3)),
             ("mhc", dict(residual="mhc")),
             ("mhc_row_col_mean", dict(residual="mhc", mhc_sinkhorn_order="row_col", mhc_reduce="mean", mhc_n=2,
                                       mhc_sinkhorn_iters=5, mhc_pre_eps=1e-6)),
             ("mhc_vres_convex", dict(residual="mhc", value_residual=True, vres_mode="learned_convex")),
             # MUDDFormer (§2): dynamic qkvr with its three pre-norms (the default), static, r alone with the tanh
             # GELU, one shared Q/K/V norm, PrePostDANorm (dynamic and static), with the value residual.
             ("mudd", dict(residual="mudd")),
             ("mudd_static", dict(residual="mudd", mudd_dynamic=False)),
             ("mudd_r_tanh", dict(residual="mudd", mudd_ways="r", mudd_gelu="tanh", mudd_hidden_round=0,
                                  mudd_last_expand=2)),
             ("mudd_one_norm", dict(residual="mudd", mudd_sep_qkv_norm=False, mudd_decay_all=False)),
             ("mudd_prepost", dict(residual="mudd", mudd_prepost_norm=True)),
             ("mudd_prepost_static", dict(residual="mudd", mudd_prepost_norm=True, mudd_dynamic=False)),
             ("mudd_vres_pair", dict(residual="mudd", value_residual=True, vres_mode="learned_pair")),
             # Delta AttnRes and the Gated Residual (docs/delta-gated-spec.md): per-sublayer deltas plain,
             # with the null source and the scalar gate, with the V route and the vector gate; Delta Block with the
             # partial sum, with the released code's schedule (null source, learnable_alpha, decay of the matrices
             # only), with the V route and the value residual; GR with 4 and 3 branches, with the value residual.
             ("delta", dict(residual="delta")),
             ("delta_null_scalar", dict(residual="delta", delta_null_source=True, delta_gate="sigmoid_scalar")),
             ("delta_v_vector", dict(residual="delta", delta_value_route="decoupled", delta_gate="sigmoid_vector")),
             ("delta_block", dict(residual="delta_block")),
             ("delta_block_code", dict(residual="delta_block", delta_block_partial=False, delta_null_source=True,
                                       delta_gate="learnable_alpha", delta_decay_all=False)),
             ("delta_block_v_vres", dict(residual="delta_block", delta_value_route="decoupled", value_residual=True)),
             ("gr", dict(residual="gr")),
             ("gr_n3_rank5", dict(residual="gr", gr_n=3, gr_rank=5, gr_decay_norm=True)),
             ("gr_vres_convex", dict(residual="gr", value_residual=True, vres_mode="learned_convex"))]
# The ones tests/python/test_cli.py trains with the attnres binary: every vres_mode once.
CLI_BASELINES = ["denseformer", "denseformer_4x5", "prenorm_vres_fixed", "block_vres_constant", "rd_vres_convex",
                 "denseformer_vres_pair", "hc", "mhc_row_col_mean", "mudd", "mudd_prepost",
                 "delta_null_scalar", "delta_v_vector", "delta_block_code", "gr_n3_rank5"]


def set_flags(settings) -> list:
    """`--set model.KEY=VALUE` flags of a settings dict (booleans as true/false)."""
    out = []
    for key, value in settings.items():
        text = str(value).lower() if isinstance(value, bool) else str(value)
        out += ["--set", f"model.{key}={text}"]
    return out

# A model small enough for tests (tests/train/test_train.cpp's kTiny), trained 8 steps of 4 x 32 tokens.
TINY = ["--preset", "tiny", "--set", "model.d_model=32", "--set", "model.n_layers=2", "--set", "model.n_heads=2",
        "--set", "model.mlp_hidden=64", "--set", "model.n_blocks=2", "--set", "train.seq_len=32",
        "--set", "train.batch_size=4", "--set", "train.tokens=1024", "--set", "train.eval_tokens=256",
        "--set", "train.threads=2", "--set", "train.lr=3e-3"]


def need_binary(test=None, path: str = BINARY) -> None:
    """Skips the test (or the class, from setUpClass) when a built executable is absent."""
    if not os.path.exists(path):
        raise unittest.SkipTest(f"{path} is not built (run the tests through CTest: `make test`)")


def cli(*args, check=True, cwd=None) -> subprocess.CompletedProcess:
    """Runs the attnres binary; on failure the assertion shows its output."""
    r = subprocess.run([BINARY, *map(str, args)], capture_output=True, text=True, cwd=cwd)
    if check and r.returncode != 0:
        raise AssertionError(f"attnres {' '.join(map(str, args))} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r


class TempDir:
    def __init__(self, name: str):
        self.path = tempfile.mkdtemp(prefix=f"attnres_py_{name}_")

    def __call__(self, *parts) -> str:
        return os.path.join(self.path, *parts)

    def cleanup(self):
        shutil.rmtree(self.path, ignore_errors=True)


WORDS = ["depth", "attention", "residual", "block", "query", "value", "key", "layer", "token", "softmax", "norm",
         "the", "a", "of", "and", "route"]


def write_corpus(directory: str, docs: int = 60, words: int = 400) -> None:
    """Synthetic documents (made here: no third-party text), as prepare_synthetic_data writes them."""
    from attnres.sampling import Rng
    os.makedirs(directory, exist_ok=True)
    rng = Rng(42)
    for d in range(docs):
        with open(os.path.join(directory, f"doc{d}.txt"), "w") as f:
            for w in range(words):
                f.write(WORDS[int(rng.uniform() * 16)] + (".\n" if w % 12 == 11 else " "))


def prepare_synthetic_data(directory: str) -> str:
    """The synthetic corpus prepared with the bytes tokenizer into DIR/data; returns that path."""
    write_corpus(os.path.join(directory, "corpus"))
    data = os.path.join(directory, "data")
    cli("prepare", "--input", os.path.join(directory, "corpus"), "--tokenizer", "bytes", "--val-fraction", "0.15",
        "--test-fraction", "0.15", "--out", data, "--quiet")
    return data
