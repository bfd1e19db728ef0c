#!/usr/bin/python3
"""The PyTorch side of `attnres bench`: runs attnres.bench_worker (python/attnres/bench_worker.py, the
package's AttnResModel timed as attnres times its own step) from the source tree, without installing
the package. Arguments and output are bench_worker's: --model-json JSON --batch B --seq T [--steps N]
[--warmup W] [--threads N] [--seed S] [--precision fp32|bf16] [--stock], or --probe, or
--matmul-rate --shapes MxNxK,... [--dtype bf16|fp32] [--reps N] [--threads N].
"""
import os
import sys

sys.dont_write_bytecode = True  # leave no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), os.pardir, "python"))

from attnres.bench_worker import main  # noqa: E402  (sets OMP_WAIT_POLICY before torch loads)

if __name__ == "__main__":
    sys.exit(main())
