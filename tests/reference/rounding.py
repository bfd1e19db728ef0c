"""How large the float32 rounding error of a computation may be, estimated in float64.

An fp32 implementation is compared with the float64 oracle; the tolerance of that comparison must
follow from the computation's own conditioning, not from one machine's kernels. A model with large
unnormalised mixing weights (MUDD's dynamic DA, HC's static streams) amplifies rounding tenfold
more than plain pre-norm, so no single number fits every mode (issue #31).

Method (a measured bound with a stated safety factor):
- The standard model of floating-point arithmetic: every operation returns its exact result times
  (1 + delta) with |delta| <= u, u = 2^-24 for float32. A sum of n terms rounds n times; in the
  blocked, vectorised sums of real kernels its error grows like sqrt(n) u relative to the result
  (Higham, Accuracy and Stability of Numerical Algorithms, §3.1 and §4.2 on probabilistic bounds).
- `rounding_estimate` runs the float64 computation `trials` times with the output of every
  rounding ATen operation (forward, backward and optimiser steps alike: TorchDispatchMode sees
  them all) multiplied by (1 + sqrt(n) u xi), n the number of terms it sums (1 for elementwise
  operations, a product's inner dimension, a reduction's length), xi uniform in [-1, 1] from a
  fixed generator. For every output it returns the element-wise largest deviation from the
  unperturbed result: the error this computation shows when each of its operations rounds as
  float32 does, whatever the magnitudes, cancellations and amplification along the way.
- A tolerance is SAFETY = 10 times the largest deviation of a tensor, plus the final rounding of
  the reference value itself (`Estimate.tolerance`).

Measured (this machine kind, AMD EPYC, OPENBLAS_CORETYPE unset and Haswell): in the Python oracle
test (tests/python/test_model.py, every mode) the largest fp32 error is 0.27 of its tolerance (2.7
times the estimate, MUDD's generator weights); in the C++ reference test (tests/reference/
test_reference.cpp, logits, gradients and a 10-step AdamW trajectory) 0.28 (HC's s_alpha
gradient). The tolerances range from 3e-6 to 1e-4 of the largest logit, so a missing term (errors
of 1e-2 and up) is caught by two orders of magnitude or more.
"""
import math

import torch
from torch.utils._python_dispatch import TorchDispatchMode

U_FLOAT32 = 2.0 ** -24
# bf16 autocast rounds both operands of every product to bf16 (unit roundoff 2^-9 each) and
# accumulates in float32: a relative error of up to 2 * 2^-9 per term.
U_BF16_PRODUCT = 2.0 ** -8
SAFETY = 10.0

# ATen operations that round (their results are not exact in floating point). Views, copies,
# indexing, comparisons, max/min, negation and the like are exact and left alone.
_ROUNDING_OPS = frozenset("""
add sub rsub mul div addcmul addcdiv lerp mm bmm addmm addbmm baddbmm matmul dot mv addmv
exp expm1 log log1p log2 sqrt rsqrt pow reciprocal tanh sigmoid erf erfinv silu gelu softplus cos sin
sum mean var std norm linalg_vector_norm cumsum logsumexp prod
_softmax _log_softmax _softmax_backward_data _log_softmax_backward_data tanh_backward sigmoid_backward
silu_backward gelu_backward threshold_backward embedding_dense_backward index_add scatter_add
""".split())
# The products, which bf16 autocast computes from bf16-rounded operands.
PRODUCT_OPS = frozenset("mm bmm addmm addbmm baddbmm matmul dot mv addmv".split())


class RoundingNoise(TorchDispatchMode):
    """Multiplies the result of every rounding floating-point ATen operation by (1 + u * xi)."""

    def __init__(self, u, generator, ops=_ROUNDING_OPS, accumulates=True):
        super().__init__()
        self.u, self.generator, self.ops, self.accumulates = u, generator, ops, accumulates

    def _reduction_length(self, name, args, out):
        """The number of terms each element of `out` sums (1 for elementwise operations)."""
        if name in ("mm", "bmm", "matmul", "dot", "mv") and isinstance(args[0], torch.Tensor):
            n = args[0].shape[-1]
        elif name in ("addmm", "addbmm", "baddbmm", "addmv") and isinstance(args[1], torch.Tensor):
            n = args[1].shape[-1]
        elif name in ("sum", "mean", "norm", "linalg_vector_norm", "var", "std", "logsumexp", "cumsum", "prod") \
                and isinstance(args[0], torch.Tensor) and isinstance(out, torch.Tensor):
            n = args[0].numel() // max(1, out.numel()) if name != "cumsum" else max(args[0].shape, default=1)
        else:
            return 1
        return max(1, int(n))

    def _perturb(self, t, terms=1):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.numel() == 0:
            return t
        xi = torch.rand(t.shape, generator=self.generator, dtype=t.dtype) * 2 - 1
        return t * (1 + self.u * math.sqrt(terms) * xi)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__.rstrip("_")
        if name not in self.ops:
            return out
        terms = self._reduction_length(name, args, out) if self.accumulates else 1
        if func.overloadpacket.__name__.endswith("_"):  # in place: perturb the tensor itself
            if isinstance(out, torch.Tensor) and out.is_floating_point():
                out.copy_(self._perturb(out, terms))
            return out
        if isinstance(out, tuple):
            return tuple(self._perturb(t, terms) for t in out)
        return self._perturb(out, terms)


class Estimate:
    """deviation: {key: element-wise largest |deviation| over the trials}."""

    def __init__(self, deviation):
        self.deviation = deviation

    def factor(self):
        """The factor between the estimate and the tolerance (module docstring)."""
        return SAFETY

    def tolerance(self, key, reference, u=U_FLOAT32):
        """The largest absolute difference allowed between an fp32 result and the float64 `reference` of `key`:
        factor() times the largest estimated deviation, plus the final rounding of the reference itself."""
        ref = torch.as_tensor(reference, dtype=torch.float64)
        return self.factor() * self.deviation[key].max().item() + 2 * u * ref.abs().max().item()


def rounding_estimate(compute, trials=4, seed=0, u=U_FLOAT32, ops=_ROUNDING_OPS, accumulates=True, exact=None):
    """compute() -> dict of float tensors, run in float64. Returns an Estimate: every key's element-wise largest
    |deviation| over `trials` runs with every rounding operation perturbed at unit roundoff u (module docstring).
    accumulates: a reduction of n terms is perturbed sqrt(n) times as much (its sum rounds n times).
    For bf16 autocast: u=U_BF16_PRODUCT, ops=PRODUCT_OPS, accumulates=False (the products' operands are rounded
    once each, coarsely; the float32 accumulation adds little to that).
    exact: compute()'s result when the caller has it already (not computed again)."""
    exact = {k: v.detach().clone() for k, v in (compute() if exact is None else exact).items()}
    worst = {k: torch.zeros_like(v) for k, v in exact.items()}
    for trial in range(trials):
        generator = torch.Generator().manual_seed(seed + trial)
        with RoundingNoise(u, generator, ops, accumulates):
            noisy = compute()
        for k, v in noisy.items():
            worst[k] = torch.maximum(worst[k], (v.detach() - exact[k]).abs())
    return Estimate(worst)
