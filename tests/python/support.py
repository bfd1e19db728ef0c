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
