"""attnres.AttnResModel against the independent float64 oracle tests/reference/attnres_ref.py in every
residual mode and control (logits, loss, depth weights, every gradient), and the package's own
contracts: parameter layout, KV-cache decoding, the invariants of the spec, bf16 autocast, the
safetensors reader/writer and checkpoint loading with its errors."""
import dataclasses
import json
import os
import re
import subprocess
import sys
import unittest

import numpy as np
import torch

import support
import rounding  # the fp32 tolerance from the computation's rounding sensitivity
import attnres_ref as R  # the oracle; sets torch's default dtype to float64 (the package must not care)
import attnres
from attnres import safetensors
from attnres.checkpoint import CheckpointError, resolve
from attnres.config import ConfigError, ModelConfig


def config_dict(residual, route="decoupled", tie=False, **kw):
    c = dict(vocab_size=11, d_model=16, n_layers=4, n_heads=2, mlp_hidden=24, residual=residual, n_blocks=2,
             value_route=route, tie_embeddings=tie, norm_eps=1e-6, rope_theta=10000.0, max_seq_len=16)
    c.update(kw)
    return c


def as_mode(c, residual):
    """Config c with another residual mode, without the keys that only apply to c's (config.MODE_KEYS)."""
    from attnres.config import MODE_KEYS
    return dict({k: v for k, v in c.items() if k not in MODE_KEYS}, residual=residual)


def all_configs(tie=True):
    """(name, config) of every AttnRes variant and every baseline (support.VARIANTS, support.BASELINES)."""
    return ([(name, config_dict(residual, route, tie)) for name, residual, route in support.VARIANTS] +
            [(name, config_dict(**dict(settings, tie=tie))) for name, settings in support.BASELINES])


def dwa_ids(sources):
    """DwaPlan::sources of block outputs X_j: the embedding, or the stream after sublayer 2j - 1."""
    return tuple(attnres.model.EMBEDDING if j == 0 else 2 * j - 1 for j in sources)


def tokens(seed=1, B=2, T=9, V=11):
    return torch.randint(0, V, (B, T + 1), generator=torch.Generator().manual_seed(seed))


def rel(a, b):
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-300)).item()


def model_with(c, P, dtype=torch.float64):
    m = attnres.AttnResModel(ModelConfig.from_json(c), dtype=dtype)
    m.load_state_dict({n: t.to(dtype) for n, t in P.items()})
    return m


def oracle_read_keys(record):
    """The oracle's recorded reads (name, alpha [n, B, T]) grouped per read: [(qk key, v key or None)], the keys
    of the oracle's outputs ("rec.<index in record>")."""
    out, i = [], 0
    while i < len(record):
        v = None
        if i + 1 < len(record) and record[i + 1][0].endswith((".value", ".write")):  # rd / delta V route, GR write
            v = f"rec.{i + 1}"
        out.append((f"rec.{i}", v))
        i += 2 if v else 1
    return out


# Modes without AttnRes reads (return_weights gives DenseFormer's DWAs, or nothing).
NO_DEPTH_READS = ("prenorm", "denseformer", "hc", "mhc", "mudd")
DELTA_MODES = ("delta", "delta_block")
MIXER = {"delta": "delta", "delta_block": "delta", "gr": "gr"}  # ReadWeights.mixer of other modes' reads: softmax


class OracleTest(unittest.TestCase):
    def test_parameter_layout_is_the_checkpoint_layout(self):
        for tie in (True, False):
            for name, c in all_configs(tie):
                want = R.param_shapes(R.parse_config(c))  # in ParamLayout order
                got = attnres.param_layout(ModelConfig.from_json(c))
                self.assertEqual([n for n, _ in got], list(want), name)
                self.assertEqual([tuple(s) for _, s in got], [tuple(s) for s in want.values()], name)
                m = attnres.AttnResModel(ModelConfig.from_json(c))
                self.assertEqual({n: tuple(t.shape) for n, t in m.state_dict().items()},
                                 {n: tuple(s) for n, s in want.items()}, name)

    def compare(self, name, c, dtype, tol64=(1e-12, 1e-10)):
        """The package in `dtype` against the float64 oracle: logits, loss, depth weights, every gradient.
        float64 must agree to rounding (tol64: relative, logits and gradients). float32 gets the same
        (float32-representable) parameters as the oracle and, per tensor, the tolerance that the computation's
        own rounding sensitivity gives (tests/reference/rounding.py: a Monte-Carlo estimate of the error of one
        rounding per operation, times 10)."""
        cfg = R.parse_config(c)
        P = R.random_params(cfg, seed=3, std=0.3, query_std=1.0)  # nonzero queries: reads are not uniform
        if dtype == torch.float32:
            P = {n: t.float().double() for n, t in P.items()}  # both sides compute from the same inputs
        toks = tokens()

        def oracle():
            rec = []
            Pg = {n: t.clone().requires_grad_(True) for n, t in P.items()}
            ref_logits = R.forward(cfg, Pg, toks[:, :-1], record=rec)
            ref_loss = -torch.log_softmax(ref_logits, -1).gather(-1, toks[:, 1:, None]).mean()
            ref_loss.backward()
            out = {"logits": ref_logits, "loss": ref_loss.reshape(1)}
            out.update({f"rec.{i}": alpha for i, (_, alpha) in enumerate(rec)})
            out.update({"grad." + n: R.zero_if_none(t) for n, t in Pg.items()})
            return out, rec

        ref, rec = oracle()
        if dtype == torch.float32:
            bound = rounding.rounding_estimate(lambda: oracle()[0])
            tolerance = lambda key: bound.tolerance(key, ref[key])  # noqa: E731
            check = lambda got, key, what: self.assertLessEqual(  # noqa: E731
                (torch.as_tensor(got).double() - ref[key]).abs().max().item(), tolerance(key), f"{name}: {what}")
        else:
            check = lambda got, key, what: self.assertLess(  # noqa: E731
                rel(got, ref[key]), tol64[1 if key.startswith("grad.") else 0], f"{name}: {what}")

        m = model_with(c, P, dtype)
        logits, reads = m(toks[:, :-1], return_weights=True)
        self.assertEqual(logits.dtype, dtype)
        check(logits.detach(), "logits", "logits")
        loss = m.loss(toks)
        check(loss.detach().reshape(1), "loss", "loss")

        dense = c["residual"] == "denseformer"
        if dense:  # the DWAs: the oracle's schedule and weights, the same for every token
            B, T = toks[:, :-1].shape
            dwas = [(i, src) for i in range(1, c["n_layers"] + 1)
                    if (src := R.dwa_sources(i, cfg["dwa_dilation"], cfg["dwa_period"]))]
            self.assertEqual([(r.read, r.sources, r.mixer) for r in reads],
                             [(2 * i, dwa_ids(src), "dwa") for i, src in dwas], f"{name}: DWAs")
            self.assertEqual(reads[-1].kind, "final" if dwas[-1][0] == c["n_layers"] else "attention")
            for r, (i, src) in zip(reads, dwas):  # the parameters themselves: exact in either precision
                self.assertTrue(torch.equal(r.qk.double(), P[f"dwa.{i}.alpha"].to(dtype).double().expand(B, T, len(src))),
                                f"{name}: DWA {i}")
                self.assertIsNone(r.v)
            expected = []
        else:
            expected = oracle_read_keys(rec)
            self.assertEqual(len(reads), len(expected), f"{name}: number of reads")
        if c["residual"] not in NO_DEPTH_READS + DELTA_MODES:  # Delta AttnRes records only reads with sources
            self.assertEqual(len(reads), 2 * c["n_layers"] + 1)
        for r, (qk, v) in zip(reads, expected):
            self.assertEqual(r.qk.shape, ref[qk].permute(1, 2, 0).shape, f"{name}: read {r.read}")
            check(r.qk.detach().permute(2, 0, 1), qk, f"read {r.read} Q/K weights")
            self.assertEqual(r.v is None, v is None, f"{name}: read {r.read} routes")
            if v is not None:
                check(r.v.detach().permute(2, 0, 1), v, f"read {r.read} V weights")
            self.assertEqual(r.mixer, MIXER.get(c["residual"], "softmax"))
            if r.mixer != "gr":  # GR's are gates: each in (0, 1), written in (0, 2)
                self.assertLess((r.qk.sum(-1) - 1).abs().max().item(), 1e-5)

        loss.backward()
        params = dict(m.named_parameters())
        for n in P:
            g, want = params[n].grad, ref["grad." + n]
            if want.abs().max() == 0:  # the first read's single source: no gradient in either
                self.assertTrue(g is None or g.abs().max().item() == 0, f"{name}: grad {n} should be 0")
                continue
            self.assertIsNotNone(g, f"{name}: no gradient for {n}")
            check(g, "grad." + n, f"grad {n}")
        # the check is not vacuous: nonzero queries make the reads non-uniform, the DWAs are not the identity
        if c["residual"] not in NO_DEPTH_READS:
            self.assertGreater(max((r.qk - 1 / r.qk.shape[-1]).abs().max().item() for r in reads), 0.05)
        for r in reads if dense else []:
            self.assertGreater((r.qk[0, 0] - torch.eye(r.qk.shape[-1])[-1]).abs().max().item(), 0.05)

    def test_float64_matches_the_oracle_in_every_mode(self):
        for name, c in all_configs():
            with self.subTest(name):
                self.compare(name, c, torch.float64)
        self.compare("rd untied", config_dict("rd", "decoupled", tie=False), torch.float64)
        self.compare("full, n_blocks=1 block", config_dict("block", n_blocks=1), torch.float64)
        self.compare("denseformer untied", config_dict("denseformer", tie=False, dwa_dilation=2), torch.float64)
        self.compare("full_vres_fixed", config_dict("full", value_residual=True), torch.float64)

    def test_float32_matches_the_oracle(self):
        for name, c in all_configs():
            with self.subTest(name):
                self.compare(name, c, torch.float32)

    def test_the_float32_tolerance_catches_a_small_error(self):
        """The rounding-derived tolerance (tests/reference/rounding.py) is not vacuous: a 1% error in one sublayer's
        output matrix, far smaller than a missing term, exceeds it in every mode family."""
        for name in ("block", "rd", "mudd", "hc", "mhc", "denseformer", "delta", "delta_block", "gr"):
            c = config_dict(name)
            cfg = R.parse_config(c)
            P = {n: t.float().double() for n, t in R.random_params(cfg, seed=3, std=0.3, query_std=1.0).items()}
            toks = tokens()
            with torch.no_grad():
                bound = rounding.rounding_estimate(lambda: {"logits": R.forward(cfg, P, toks[:, :-1])})
                ref = R.forward(cfg, P, toks[:, :-1])
                wrong = dict(P, **{"layers.1.mlp.w_down.weight": P["layers.1.mlp.w_down.weight"] * 1.01})
                err = (R.forward(cfg, wrong, toks[:, :-1]) - ref).abs().max().item()
            self.assertGreater(err, 3 * bound.tolerance("logits", ref), name)

    def test_kv_cache_decoding_matches_the_full_pass(self):
        for name, c in all_configs(tie=False):
            m = model_with(c, R.random_params(R.parse_config(c), seed=4, std=0.3, query_std=1.0))
            toks = tokens(2, T=10)[:, :10]
            with torch.no_grad():
                full = m(toks)
                cache = m.new_cache(batch=2, max_seq=10)
                step = m(toks[:, :3], cache=cache)
                self.assertLess(rel(step, full[:, :3]), 1e-12, name)
                for t in range(3, 10):
                    step = m(toks[:, t:t + 1], cache=cache)
                    self.assertLess(rel(step[:, 0], full[:, t]), 1e-12, f"{name} position {t}")
                self.assertEqual(cache.length, 10)
                with self.assertRaisesRegex(ValueError, "context is full"):
                    m(toks[:, :1], cache=cache)
        with self.assertRaisesRegex(ValueError, "max_seq_len 16"):
            m(torch.zeros(1, 17, dtype=torch.long))

    def test_sdpa_attention_is_the_same_function(self):
        """model.set_attention("sdpa") (F.scaled_dot_product_attention, scripts/torch_peer.py) computes the
        matmul path's logits in every mode; a torch without it (Debian's 1.13) is refused by name."""
        c = config_dict("rd")
        m = model_with(c, R.random_params(R.parse_config(c), seed=4, std=0.3, query_std=1.0))
        with self.assertRaisesRegex(ValueError, "attention 'flash'"):
            m.set_attention("flash")
        if not attnres.model.sdpa_available():
            with self.assertRaisesRegex(RuntimeError, "torch >= 2.1.*" + re.escape(torch.__version__)):
                m.set_attention("sdpa")
            self.skipTest(f"torch {torch.__version__} has no F.scaled_dot_product_attention(scale=)")
        for name, c in all_configs(tie=False):
            m = model_with(c, R.random_params(R.parse_config(c), seed=4, std=0.3, query_std=1.0))
            toks = tokens(2, T=10)[:, :10]
            with torch.no_grad():
                ref = m(toks)
                got = m.set_attention("sdpa")(toks)
                self.assertLess(rel(got, ref), 1e-12, name)
                cache = m.new_cache(batch=2, max_seq=10)  # decoding keeps the matmul path
                self.assertLess(rel(m(toks[:, :4], cache=cache), ref[:, :4]), 1e-12, name)
                m.set_attention("matmul")

    def test_spec_invariants(self):
        toks = tokens(5)
        P = R.random_params(R.parse_config(config_dict("rd")), seed=5, std=0.3, query_std=1.0)
        block = model_with(config_dict("block"), {n: t for n, t in P.items() if "value_query" not in n})
        tied = model_with(config_dict("rd", "tied"), {n: t for n, t in P.items() if "value_query" not in n})
        with torch.no_grad():
            self.assertTrue(torch.equal(tied(toks), block(toks)), "rd+tied must equal block bit for bit")
            decoupled = model_with(config_dict("rd"), P)
            self.assertGreater(rel(decoupled(toks), block(toks)), 1e-4, "a value query must change rd")
            # zero queries, eps -> 0: block and full compute the pre-norm function (spec §4)
            P0 = R.random_params(R.parse_config(config_dict("block")), seed=6, std=0.3, query_std=0.0)
            pre = model_with(config_dict("prenorm", norm_eps=1e-12), {n: t for n, t in P0.items() if "_res" not in n})
            for residual in ("block", "full"):
                m = model_with(config_dict(residual, norm_eps=1e-12), P0)
                self.assertLess(rel(m(toks), pre(toks)), 1e-9, residual)

    def test_baseline_invariants(self):
        """baselines-spec §1.6 and §5.5: DenseFormer at its identity init is pre-norm bit for bit; the value
        residual with constant (0, 1) is the mode without it bit for bit; the initial values are C++'s."""
        toks = tokens(9)
        with torch.no_grad():
            for dilation, period, layers in ((1, 1, 4), (4, 5, 10), (2, 3, 6)):
                c = config_dict("denseformer", n_layers=layers, dwa_dilation=dilation, dwa_period=period)
                dense = attnres.AttnResModel(ModelConfig.from_json(c), dtype=torch.float64, seed=2)
                for i, src in ((i, R.dwa_sources(i, dilation, period)) for i in range(1, layers + 1)):
                    if src:  # identity: 1 on the block's own output, last
                        self.assertEqual(dense.dwa[str(i)].alpha.tolist(), [0.0] * (len(src) - 1) + [1.0])
                pre = model_with(dict(c, residual="prenorm"),
                                 {n: t for n, t in dense.state_dict().items() if not n.startswith("dwa.")})
                self.assertTrue(torch.equal(dense(toks), pre(toks)), f"denseformer {dilation}x{period} at init")
                dense.dwa[str(period)].alpha[0] = 0.5
                self.assertGreater(rel(dense(toks), pre(toks)), 1e-3)

            # HC and mHC: the initial values are ParamLayout's (the oracle's C++ twin), and HC at init computes
            # pre-norm's function (spec §3.1: A_m = e_home, A_r = I, B = 1, W = 0: every stream is pre-norm's
            # x), up to the rounding of the readout (n x with the sum, which the final norm undoes exactly
            # only with norm_eps = 0).
            for name, c in all_configs():
                if c["residual"] not in ("hc", "mhc"):
                    continue
                c = dict(c, norm_eps=0.0)
                m = attnres.AttnResModel(ModelConfig.from_json(c), dtype=torch.float64, seed=4)
                n = c.get("hc_n" if c["residual"] == "hc" else "mhc_n", 4)
                for j in range(2 * c["n_layers"]):
                    if c["residual"] == "hc":
                        mod = m.hc[j]
                        want = torch.cat([torch.eye(n)[:, j % n:j % n + 1], torch.eye(n)], 1)
                        self.assertTrue(torch.equal(mod.A, want.double()), f"{name} hc.{j}.A")
                        self.assertEqual(mod.B.tolist(), [1.0] * n)
                        if c.get("hc_dynamic", True):
                            self.assertEqual((mod.w_alpha.abs().max().item(), mod.w_beta.abs().max().item()), (0, 0))
                            self.assertEqual((mod.s_alpha.item(), mod.s_beta.item()), (0.01, 0.01))
                    else:
                        mod = m.mhc[j]
                        self.assertEqual(mod.alpha.tolist(), [0.01] * 3)
                        b = torch.full((n,), -3.0)
                        b[j % n] = 3.0
                        want = torch.cat([b, torch.zeros(n), (6 * torch.eye(n) - 3).flatten()])
                        self.assertTrue(torch.equal(mod.b, want.double()), f"{name} mhc.{j}.b")
                        self.assertLess(abs(mod.phi.std().item() - 0.02), 0.004, name)
                if c["residual"] == "hc":
                    cut = dict(c, residual="prenorm")
                    pre = model_with(cut, {k: t for k, t in m.state_dict().items() if not k.startswith("hc.")})
                    self.assertLess(rel(m(toks), pre(toks)), 1e-12, f"{name} at init")
                    self.assertGreater(rel(model_with(c, R.random_params(R.parse_config(c), seed=5, std=0.3))(toks),
                                           pre(toks)), 1e-3, f"{name}: the streams change the model")

            # MUDD at its initialisation is pre-norm bit for bit (every stream is the block output; with
            # PrePostDANorm x + 0 and x + RMSNorm(0) = x), in every variant.
            for name, c in all_configs():
                if c["residual"] != "mudd":
                    continue
                m = attnres.AttnResModel(ModelConfig.from_json(c), dtype=torch.float64, seed=6)
                keep = {k: t for k, t in m.state_dict().items()
                        if not k.startswith("mudd.") and "attn_norm_" not in k}
                pre = model_with(dict(c, residual="prenorm"), keep)
                self.assertTrue(torch.equal(m(toks), pre(toks)), f"{name} at init")
                self.assertLess(abs(m.mudd._modules["0"].w1.std().item() * 4 - 1) if c.get("mudd_dynamic", True)
                                else 0, 0.2, name)  # N(0, 1/sqrt(d)), d = 16
                self.assertGreater(rel(model_with(c, R.random_params(R.parse_config(c), seed=5, std=0.3))(toks),
                                       pre(toks)), 1e-3, f"{name}: the DA modules change the model")

            for name, c in all_configs():
                if not c.get("value_residual"):
                    continue
                m = attnres.AttnResModel(ModelConfig.from_json(c), dtype=torch.float64, seed=3)
                want = {"learned_convex": [c.get("vres_lambda1", 0.5)],
                        "learned_pair": [c.get("vres_lambda1", 0.5), c.get("vres_lambda2", 0.5)]}.get(c.get("vres_mode", "fixed"))
                for i, layer in enumerate(m.layers):
                    got = getattr(layer.attn, "vres_lambda", None)
                    self.assertEqual(None if got is None else got.tolist(), want if i >= 1 else None, f"{name} {i}")
                P = R.random_params(R.parse_config(c), seed=5, std=0.3, query_std=1.0)
                plain = {n: t for n, t in P.items() if "vres_lambda" not in n}
                without = model_with(dict(c, value_residual=False), plain)
                identity = model_with(dict(c, vres_mode="constant", vres_lambda1=0.0, vres_lambda2=1.0), plain)
                self.assertTrue(torch.equal(identity(toks), without(toks)), f"{name}: constant (0, 1)")
                self.assertGreater(rel(model_with(c, P)(toks), without(toks)), 1e-3, f"{name}: V' changes the model")

    def test_delta_and_gr_invariants(self):
        """docs/delta-gated-spec.md §1.5, §2.5: the initial values are the spec's (zero queries and null sources,
        gates at their starts, GR's zero-centred norms); at its initialisation Delta AttnRes computes pre-norm's
        function up to epsilon (h = (1 + 1/n) x: the sources of a read sum to the stream), learnable_alpha
        bit for bit; GR with W_up = 0, W_inject = 0 and zero norms is pre-norm with every norm weight 1/2."""
        toks = tokens(11)
        with torch.no_grad():
            for name, c in all_configs(tie=False):
                if c["residual"] not in DELTA_MODES:
                    continue
                c = dict(c, norm_eps=1e-12)
                m = attnres.AttnResModel(ModelConfig.from_json(c), dtype=torch.float64, seed=7)
                for i, layer in enumerate(m.layers):
                    for read in (layer.attn_res, layer.mlp_res):
                        self.assertEqual((read.query.abs().max().item(), read.key_norm.weight.tolist()), (0, [1.0] * 16))
                        if c.get("delta_null_source"):
                            self.assertEqual(read.null_source.abs().max().item(), 0)
                        gate = c.get("delta_gate", "none")
                        if gate == "sigmoid_scalar":
                            self.assertEqual(read.gate_logit.tolist(), [-2.0])
                        elif gate == "learnable_alpha":
                            self.assertEqual(read.gate_alpha.tolist(), [0.0])
                        elif gate == "sigmoid_vector":
                            self.assertEqual((read.gate.weight.abs().max().item(), read.gate.bias.tolist()), (0, [-2.0] * 16))
                pre = model_with(as_mode(c, "prenorm"), {k: t for k, t in m.state_dict().items() if "_res." not in k})
                if c.get("delta_block_partial", True):
                    self.assertLess(rel(m(toks), pre(toks)), 1e-9, f"{name} at init")
                if c.get("delta_gate") == "learnable_alpha":
                    self.assertTrue(torch.equal(m(toks), pre(toks)), f"{name}: learnable_alpha 0")
                moved = model_with(c, R.random_params(R.parse_config(c), seed=5, std=0.3, query_std=1.0))
                self.assertGreater(rel(moved(toks), model_with(
                    as_mode(c, "prenorm"), {k: t for k, t in moved.state_dict().items() if "_res." not in k})(toks)),
                    1e-3, f"{name}: the reads change the model")
            for name, c in all_configs(tie=True):
                if c["residual"] != "gr":
                    continue
                m = attnres.AttnResModel(ModelConfig.from_json(c), dtype=torch.float64, seed=8)
                n = c.get("gr_n", 4)
                for mod in list(m.gr) + [m.gr_final]:
                    self.assertEqual(mod.norm.weight.abs().max().item(), 0)
                    self.assertLess(abs(mod.w_down.std().item() - 0.02), 0.004, name)
                self.assertEqual(tuple(m.gr[0].w_down.shape), (c.get("gr_rank", 0) or 2, n * 16))
                state = m.state_dict()
                for k in state:
                    if k.endswith(("w_up", "w_inject")):
                        state[k].zero_()
                plain = as_mode(c, "prenorm")
                half = {k: t for k, t in state.items() if not k.startswith("gr")}
                half.update({k: torch.full(s, 0.5) for k, s in attnres.param_layout(ModelConfig.from_json(plain))
                             if k.endswith("norm.weight")})
                self.assertLess(rel(model_with(c, state)(toks), model_with(plain, half)(toks)), 1e-12, name)

    def test_routing_max_weight(self):
        """The routing-collapse statistic (spec §1.8): the mean over tokens of each read's largest weight."""
        c = config_dict("delta_block", delta_null_source=True)
        m = model_with(c, R.random_params(R.parse_config(c), seed=3, std=0.3, query_std=1.0))
        with torch.no_grad():
            _, reads = m(tokens()[:, :-1], return_weights=True)
        per_read, mean = attnres.routing_max_weight(reads)
        self.assertEqual(sorted(per_read), [r.read for r in reads if r.qk.shape[-1] > 1])
        r = reads[3]
        self.assertAlmostEqual(per_read[r.read], r.qk.max(-1).values.mean().item(), places=12)
        self.assertAlmostEqual(mean, sum(per_read.values()) / len(per_read), places=12)
        self.assertTrue(all(1 / 6 < v <= 1 for v in per_read.values()))
        self.assertEqual(reads[0].source_labels(), ["null"])  # sublayer 0 reads the null source alone
        self.assertEqual(reads[5].source_labels(), ["null", "emb", "b1", "b2^1"])  # blocks of 4 sublayers
        self.assertEqual(len(attnres.routing_max_weight(reads, single_source=True)[0]), len(reads))
        # uniform reads (zero queries): the largest weight is 1/n
        m0 = attnres.AttnResModel(ModelConfig.from_json(config_dict("delta")), dtype=torch.float64)
        with torch.no_grad():
            _, reads0 = m0(tokens()[:, :-1], return_weights=True)
        for j, v in attnres.routing_max_weight(reads0)[0].items():
            self.assertAlmostEqual(v, 1 / (j + 1), places=12)
        self.assertEqual([r.source_labels() for r in reads0[:2]], [["emb", "b1"], ["emb", "b1", "b2"]])

    def test_unknown_residual_modes_are_refused(self):
        """A mode the package lacks (a newer attnres's) is an error naming it and the known ones, also with keys
        of its own; the config's list of modes is the one the model implements."""
        from attnres.config import RESIDUALS
        self.assertEqual(tuple(attnres.model.MODES), RESIDUALS)
        known = "prenorm, full, block, rd, denseformer, hc, mhc, mudd, delta, delta_block, gr"
        for residual in ("mudd2", "moe"):
            with self.assertRaisesRegex(ConfigError, f"x.safetensors: unknown residual mode '{residual}' "
                                                     f"\\(expected {known}\\)"):
                ModelConfig.from_json(dict(config_dict(residual), mudd_expand=2), where="x.safetensors")
            with self.assertRaisesRegex(ValueError, f"residual mode '{residual}' has no PyTorch implementation "
                                                    f"\\(known: {known}\\)"):
                attnres.model.residual_mode(dataclasses.replace(ModelConfig(), residual=residual))

    def test_bf16_autocast_runs_close_to_fp32(self):
        c = config_dict("rd")
        m = model_with(c, R.random_params(R.parse_config(c), seed=7, std=0.3, query_std=1.0), torch.float32)
        toks = tokens(6)
        with torch.no_grad():
            ref = m(toks[:, :-1])
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = m(toks[:, :-1])
            loss = torch.nn.functional.cross_entropy(out.reshape(-1, 11), toks[:, 1:].reshape(-1))
        self.assertEqual(out.dtype, torch.bfloat16)
        # Within the bound of bf16-rounded product operands (tests/reference/rounding.py), estimated in float64.
        exact = model_with(c, {n: t.double() for n, t in m.state_dict().items()}, torch.float64)
        with torch.no_grad():
            bound = rounding.rounding_estimate(lambda: {"logits": exact(toks[:, :-1])}, u=rounding.U_BF16_PRODUCT,
                                               ops=rounding.PRODUCT_OPS, accumulates=False)
            # the bf16 result itself is stored in bf16: one more rounding of each logit
            tolerance = bound.factor() * bound.deviation["logits"].max().item() + 2 ** -8 * ref.abs().max().item()
        self.assertLessEqual((out.double() - ref.double()).abs().max().item(), tolerance)
        self.assertGreater(rel(out.float(), ref), 0)  # it did run in bf16
        loss.backward()
        self.assertEqual(m.tok_emb.weight.grad.dtype, torch.float32)

    def test_fine_tuning_lowers_the_loss(self):
        m = attnres.AttnResModel(ModelConfig.from_json(config_dict("rd")), seed=3)
        toks = tokens(7)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        first = None
        for _ in range(20):
            opt.zero_grad()
            loss = m.loss(toks)
            loss.backward()
            opt.step()
            first = loss.item() if first is None else first
        self.assertLess(loss.item(), first - 0.5)


class SamplingTest(unittest.TestCase):
    """attnres.generate's controls (its equality with `attnres sample` is in test_cli)."""

    def test_rng_is_attnres_rng(self):
        # xoshiro256** seeded by splitmix64 (src/util/rng.hpp): splitmix64(0)'s first output is the
        # published 0xe220a8397b1dcdaf; uniform() takes the top 53 bits
        r = attnres.Rng(0)
        self.assertEqual(r.s[0], 0xE220A8397B1DCDAF)
        a, b = attnres.Rng(5, "sample"), attnres.Rng(5, "sample")
        self.assertEqual([a.uniform() for _ in range(5)], [b.uniform() for _ in range(5)])
        self.assertNotEqual(attnres.Rng(5, "sample").uniform(), attnres.Rng(5, "other").uniform())
        self.assertTrue(all(0 <= attnres.Rng(9).uniform() < 1 for _ in range(3)))

    def test_sample_token_controls(self):
        logits = np.array([0.5, 2.0, 2.0, -1.0, 1.5, 0.0], dtype=np.float32)
        rng = attnres.Rng(1, "test")
        self.assertEqual(attnres.sample_token(logits, 0, 0, rng), 2)  # greedy: the largest id among ties
        draws = [attnres.sample_token(logits, 1.0, 3, rng) for _ in range(3000)]
        self.assertEqual(set(draws), {1, 2, 4})  # top-3 only
        p = np.exp(logits[[1, 2, 4]].astype(np.float64))
        p /= p.sum()
        freq = np.array([draws.count(i) for i in (1, 2, 4)]) / len(draws)
        self.assertLess(np.abs(freq - p).max(), 0.04)
        cold = [attnres.sample_token(logits, 0.05, 0, rng) for _ in range(200)]
        self.assertEqual(set(cold), {1, 2})  # low temperature: almost greedy
        self.assertEqual({attnres.sample_token(logits, 5.0, 1, rng) for _ in range(50)}, {1})  # top-1: the best

    def test_generate_is_deterministic_per_seed(self):
        c = config_dict("rd", vocab_size=257, max_seq_len=32)
        m = model_with(c, R.random_params(R.parse_config(c), seed=8, std=0.5, query_std=1.0), torch.float32)
        gen = lambda **kw: attnres.generate(m, "ab", tokenizer="bytes", max_tokens=12, **kw)  # noqa: E731
        self.assertEqual(gen(seed=3), gen(seed=3))
        self.assertNotEqual(gen(seed=3), gen(seed=4))
        self.assertEqual(gen(temperature=0, seed=3), gen(temperature=0, seed=4))
        self.assertEqual(gen(top_k=1, seed=3), gen(temperature=0))
        ids = list(attnres.generate_ids(m, [256, 97], max_tokens=100))
        self.assertEqual(len(ids), 31)  # as attnres sample: the token that fills the context of 32 is the last
        with self.assertRaisesRegex(ValueError, "longer than the model's context"):
            attnres.generate(m, "x" * 40, tokenizer="bytes")
        with self.assertRaisesRegex(ValueError, "does not name its tokenizer"):
            attnres.generate(m, "ab")
        with self.assertRaisesRegex(ValueError, "does not fit the model's vocabulary"):
            attnres.generate(model_with(config_dict("rd"), R.random_params(R.parse_config(config_dict("rd")))),
                             "ab", tokenizer="bytes")


class FilesTest(unittest.TestCase):
    def setUp(self):
        self.tmp = support.TempDir("files")
        self.addCleanup(self.tmp.cleanup)

    def test_safetensors_round_trip_and_errors(self):
        rng = np.random.default_rng(0)
        t = {"a": rng.standard_normal((3, 5)), "b": rng.standard_normal(7).astype(np.float32),
             "c": rng.integers(-9, 9, (2, 3), dtype=np.int32), "scalar": np.array(1.25), "empty": np.zeros((0, 3))}
        path = self.tmp("t.safetensors")
        safetensors.save(path, t, {"config": "{}", "note": "héllo"})
        back, meta = safetensors.load(path)
        self.assertEqual(meta, {"config": "{}", "note": "héllo"})
        for k in t:
            self.assertEqual(back[k].dtype, t[k].dtype)
            self.assertTrue(np.array_equal(back[k], t[k]), k)
        self.assertEqual(oct(os.stat(path).st_mode & 0o777), oct(0o666 & ~self._umask()))
        # the oracle's independent reader agrees
        back2, meta2 = R.load_safetensors(path)
        self.assertTrue(np.array_equal(back2["a"], t["a"]))
        with open(path, "rb") as f:
            blob = f.read()
        with open(self.tmp("cut.safetensors"), "wb") as f:
            f.write(blob[:-8])
        with self.assertRaisesRegex(safetensors.SafetensorsError, "cut.safetensors.*outside the file"):
            safetensors.load(self.tmp("cut.safetensors"))
        with open(self.tmp("junk.safetensors"), "wb") as f:
            f.write(b"\x05\x00\x00\x00\x00\x00\x00\x00{junk")
        with self.assertRaisesRegex(safetensors.SafetensorsError, "junk.safetensors.*malformed JSON"):
            safetensors.load(self.tmp("junk.safetensors"))

    @staticmethod
    def _umask():
        m = os.umask(0)
        os.umask(m)
        return m

    def test_save_then_load_round_trips_and_checks_the_tensors(self):
        c = config_dict("rd", "average")
        m = attnres.AttnResModel(ModelConfig.from_json(c), seed=1)
        with torch.no_grad():
            for p in m.parameters():
                p.add_(torch.randn_like(p) * 0.1)
        attnres.save(m, self.tmp("model.safetensors"), tokenizer="bytes")
        back = attnres.load(self.tmp())  # a run directory
        self.assertEqual(back.config, m.config)
        self.assertEqual(back.tokenizer_spec, "bytes")
        for (n, a), (n2, b) in zip(m.state_dict().items(), back.state_dict().items()):
            self.assertTrue(torch.equal(a, b), n)
        self.assertEqual(attnres.read_config(self.tmp("model.safetensors")), m.config)

        # the flat checkpoint form: params in ParamLayout order
        flat = np.concatenate([m.state_dict()[n].numpy().reshape(-1) for n, _ in attnres.param_layout(m.config)])
        meta = {"config": json.dumps(c)}
        safetensors.save(self.tmp("checkpoint.safetensors"), {"params": flat, "adam.m": flat * 0}, meta)
        flat_model = attnres.load(self.tmp("checkpoint.safetensors"))
        for n, t in m.state_dict().items():
            self.assertTrue(torch.equal(flat_model.state_dict()[n], t), n)
        self.assertIsNone(flat_model.tokenizer_spec)

        safetensors.save(self.tmp("short.safetensors"), {"params": flat[:-1]}, meta)
        with self.assertRaisesRegex(CheckpointError, "short.safetensors.*params"):
            attnres.load(self.tmp("short.safetensors"))
        arrays = {n: t.numpy() for n, t in m.state_dict().items() if "value_query" not in n}
        arrays["junk"] = np.zeros(1, np.float32)
        safetensors.save(self.tmp("bad.safetensors"), arrays, meta)
        with self.assertRaisesRegex(CheckpointError, r"missing \['layers.0.attn_res.value_query'.*unexpected \['junk'\]"):
            attnres.load(self.tmp("bad.safetensors"))
        safetensors.save(self.tmp("noconfig.safetensors"), {"params": flat})
        with self.assertRaisesRegex(CheckpointError, "noconfig.safetensors.*no 'config'"):
            attnres.load(self.tmp("noconfig.safetensors"))
        with self.assertRaisesRegex(CheckpointError, "neither model.safetensors nor a checkpoint"):
            os.makedirs(self.tmp("empty"))
            attnres.load(self.tmp("empty"))
        # A run directory without model.safetensors: its newest checkpoint (by step, not by name).
        os.makedirs(self.tmp("run"))
        for step, scale in ((8, 1.0), (10, 0.0), (9, 1.0)):
            safetensors.save(self.tmp(f"run/checkpoint-{step:06d}.safetensors"), {"params": flat * scale}, meta)
        safetensors.save(self.tmp("run/checkpoint.safetensors"), {"params": flat}, meta)  # an older run's: the oldest
        self.assertEqual(resolve(self.tmp("run")), self.tmp("run/checkpoint-000010.safetensors"))
        self.assertEqual(float(attnres.load(self.tmp("run")).tok_emb.weight.abs().sum()), 0.0)

    # XXH3-64 (seed 0) as libxxhash computes it for attnres (src/util/checksum.cpp).
    XXH3_VECTORS = {b"": "2d06800538d394c2", b"abc": "78af5f94892f3950"}

    def test_checksums_are_attnres_xxh3(self):
        big = np.random.default_rng(3).integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()
        backends = {name: make() for name, make in safetensors._XXH3_BACKENDS.items()}
        self.assertIsNotNone(backends["library"], "libxxhash (libxxhash0, beside libxxhash-dev) is not loadable")
        for name, digest in backends.items():
            if digest is None:
                continue  # the xxhash module is optional (python3-xxhash)
            for data, want in self.XXH3_VECTORS.items():
                self.assertEqual(digest(data), want, name)
            self.assertEqual(digest(memoryview(big)[5:1000]), backends["library"](big[5:1000]), name)
        for data, want in self.XXH3_VECTORS.items():
            self.assertEqual(safetensors.xxh3_64_hex(data), want)
        # What save records: every tensor's payload and the other metadata, as attnres writes them.
        path = self.tmp("sums.safetensors")
        t = {"b": np.arange(6, dtype=np.float32), "a": np.zeros((2, 2)), "empty": np.zeros(0, np.int32)}
        meta = {"config": "{}", "note": 'héllo "q" \\ \n\t\x01 \u2028 😀'}
        safetensors.save(path, t, meta)
        header, read_meta, begin = safetensors.read_header(path)
        self.assertEqual(read_meta, meta)
        with open(path, "rb") as f:
            raw = f.read()
        n = int.from_bytes(raw[:8], "little")
        sums = json.loads(json.loads(raw[8:8 + n])["__metadata__"]["attnres.checksum"])
        self.assertEqual(sums["algorithm"], "xxh3-64")
        self.assertEqual(set(sums["tensors"]), set(t))
        for name, entry in header.items():
            lo, hi = entry["data_offsets"]
            self.assertEqual(sums["tensors"][name], safetensors.xxh3_64_hex(raw[begin + lo:begin + hi]), name)
        text = json.dumps(meta, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        self.assertEqual(sums["metadata"], safetensors.xxh3_64_hex(text.encode()))
        with self.assertRaisesRegex(safetensors.SafetensorsError, "'attnres.checksum' is reserved"):
            safetensors.save(path, t, {"attnres.checksum": "{}"})

    def _rewrite_header(self, src, dst, edit):
        """Copies a safetensors file with its JSON header changed by edit(header) (data unchanged)."""
        with open(src, "rb") as f:
            raw = f.read()
        n = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8:8 + n])
        edit(header)
        h = json.dumps(header).encode()
        h += b" " * (-len(h) % 8)
        with open(dst, "wb") as f:
            f.write(len(h).to_bytes(8, "little") + h + raw[8 + n:])

    def test_load_checks_what_attnres_checks(self):
        m = attnres.AttnResModel(ModelConfig.from_json(config_dict("rd")), seed=1)
        good = self.tmp("model.safetensors")
        attnres.save(m, good, tokenizer="bytes")
        header, _, begin = safetensors.read_header(good)
        # A flipped byte: the tensor it lies in is named, as attnres names it.
        name, entry = next(iter(header.items()))
        lo = entry["data_offsets"][0]
        with open(good, "rb") as f:
            raw = bytearray(f.read())
        raw[begin + lo + 3] ^= 0x10
        with open(self.tmp("flipped.safetensors"), "wb") as f:
            f.write(raw)
        with self.assertRaisesRegex(safetensors.SafetensorsError,
                                    f"flipped.safetensors': tensor '{re.escape(name)}' does not match its checksum "
                                    r"\(xxh3-64 [0-9a-f]{16}, stored [0-9a-f]{16}\): the file is corrupt"):
            attnres.load(self.tmp("flipped.safetensors"))
        # A changed metadata value; digests naming a tensor the file lacks; another algorithm.
        edits = {"meta.safetensors": (lambda h: h["__metadata__"].update(tokenizer="gpt2:/x"),
                                      "meta.safetensors': the metadata does not match its checksum"),
                 "ghost.safetensors": (lambda h: h["__metadata__"].update({"attnres.checksum": json.dumps(
                     dict(json.loads(h["__metadata__"]["attnres.checksum"]),
                          tensors=dict(json.loads(h["__metadata__"]["attnres.checksum"])["tensors"], ghost="0" * 16)))}),
                                       "names tensor 'ghost', which the file does not hold"),
                 "algo.safetensors": (lambda h: h["__metadata__"].update({"attnres.checksum": json.dumps(
                     dict(json.loads(h["__metadata__"]["attnres.checksum"]), algorithm="md5"))}),
                                      "checksum algorithm 'md5' is not supported")}
        for file, (edit, message) in edits.items():
            self._rewrite_header(good, self.tmp(file), edit)
            with self.assertRaisesRegex(safetensors.SafetensorsError, message):
                attnres.load(self.tmp(file))
        # Overlapping tensors are refused too.
        def overlap(h):  # two tensors of one size on the same bytes
            h["layers.0.attn.wk.weight"]["data_offsets"] = h["layers.0.attn.wq.weight"]["data_offsets"]
        self._rewrite_header(good, self.tmp("overlap.safetensors"), overlap)
        with self.assertRaisesRegex(safetensors.SafetensorsError, "overlap.safetensors.*(overlaps|hole)"):
            attnres.load(self.tmp("overlap.safetensors"))
        # No digests (another tool, or attnres before them): loads, with a warning naming the file.
        self._rewrite_header(good, self.tmp("old.safetensors"), lambda h: h["__metadata__"].pop("attnres.checksum"))
        with self.assertWarnsRegex(safetensors.UnverifiedWarning, "old.safetensors' carries no payload checksum"):
            old = attnres.load(self.tmp("old.safetensors"))
        self.assertTrue(torch.equal(old.tok_emb.weight, m.tok_emb.weight))
        self.assertNotIn("attnres.checksum", old.metadata)
        # NaN and infinite weights (with valid digests): refused, naming the tensor and the element.
        state = {n: t.detach().numpy().copy() for n, t in m.state_dict().items()}
        flat = np.concatenate([state[n].reshape(-1) for n, _ in attnres.param_layout(m.config)])
        meta = {"config": json.dumps(m.config.to_json())}
        for value, what in ((np.nan, "a NaN"), (np.inf, "an infinity")):
            bad = dict(state)
            bad["layers.1.attn.wq.weight"] = bad["layers.1.attn.wq.weight"].copy()
            bad["layers.1.attn.wq.weight"].reshape(-1)[7] = value
            safetensors.save(self.tmp("nan.safetensors"), bad, meta)
            with self.assertRaisesRegex(CheckpointError, "nan.safetensors': tensor 'layers.1.attn.wq.weight' holds "
                                        f"{what} \\(element 7 of "):
                attnres.load(self.tmp("nan.safetensors"))
        # In a checkpoint's flat params: named by the parameter it belongs to (ParamLayout order: tok_emb, then
        # layers.0.attn_norm.weight).
        flat_bad = flat.copy()
        flat_bad[state["tok_emb.weight"].size + 2] = np.nan
        safetensors.save(self.tmp("ckpt.safetensors"), {"params": flat_bad}, meta)
        with self.assertRaisesRegex(CheckpointError,
                                    r"ckpt.safetensors': tensor 'layers.0.attn_norm.weight' holds a NaN \(element 2 of"):
            attnres.load(self.tmp("ckpt.safetensors"))

    def test_score_refuses_nothing_to_score(self):
        m = attnres.AttnResModel(ModelConfig.from_json(config_dict("block", vocab_size=257)), seed=1)
        for text in ("", [""], ["", ""]):
            with self.assertRaisesRegex(ValueError, "nothing to score"):
                attnres.score(m, text, tokenizer="bytes")
        self.assertEqual(attnres.score(m, ["", "ab"], tokenizer="bytes")["tokens"], 2)

    def test_config_is_as_strict_as_attnres(self):
        c = config_dict("block")
        # Every key is written (the baselines' keys too); a config without them reads with their defaults.
        self.assertEqual(ModelConfig.from_json(json.dumps(c)).to_json(), dict(ModelConfig().to_json(), **c))
        for bad, message in ((dict(c, residual="blok"), "unknown residual mode 'blok'"),
                             (dict(c, value_route="x"), "unknown value route"),
                             (dict(c, n_blocks=3), "n_blocks \\(3\\) must divide"),
                             (dict(c, n_layers=3, n_blocks=2), "even number of sublayers"),
                             (dict(c, n_heads=3), "n_heads \\(3\\) must divide"),
                             (dict(c, d_model=True), "'d_model' must be an integer"),
                             (dict(c, tie_embeddings=1), "'tie_embeddings' must be true or false"),
                             (dict(c, extra=1), "unknown model config key 'extra'"),
                             (dict(c, vres_mode="learned"), "unknown value 'learned' of vres_mode"),
                             (dict(c, mudd_ways="qk"), "unknown value 'qk' of mudd_ways"),
                             (dict(c, mudd_gelu="relu"), "unknown value 'relu' of mudd_gelu"),
                             (dict(c, mudd_hidden_round=-1), "mudd_hidden_round must be at least 0"),
                             (dict(c, mudd_last_expand=0), "mudd_last_expand must be at least 1"),
                             (dict(c, hc_n=9), "hc_n must be 1 to 8 \\(got 9\\)"),
                             (dict(c, mhc_n=0), "mhc_n must be 1 to 8 \\(got 0\\)"),
                             (dict(c, hc_reduce="max"), "unknown value 'max' of hc_reduce"),
                             (dict(c, mhc_reduce="max"), "unknown value 'max' of mhc_reduce"),
                             (dict(c, mhc_sinkhorn_order="rows"), "unknown value 'rows' of mhc_sinkhorn_order"),
                             (dict(c, mhc_bias_init="ones"), "unknown value 'ones' of mhc_bias_init"),
                             (dict(c, mhc_sinkhorn_iters=0), "mhc_sinkhorn_iters must be at least 1"),
                             (dict(c, mhc_phi_std=-0.1), "mhc_phi_std must be at least 0"),
                             (dict(c, mhc_pre_eps=-1e-6), "mhc_pre_eps must be at least 0"),
                             (dict(c, dwa_dilation=0), "dwa_dilation and dwa_period must be at least 1"),
                             (dict(c, dwa_period=-1), "dwa_dilation and dwa_period must be at least 1"),
                             (dict(c, dwa_period=2.0), "'dwa_period' must be an integer"),
                             (dict(c, value_residual="true"), "'value_residual' must be true or false"),
                             (dict(c, dwa_weight_decay=0), "'dwa_weight_decay' must be true or false"),
                             (dict(c, vres_lambda1="0.5"), "'vres_lambda1' must be a finite number"),
                             (dict(c, vres_lambda2=float("nan")), "'vres_lambda2' must be a finite number"),
                             (dict(c, d_model=1024, n_heads=2), "head_dim = d_model / n_heads must be at most 256"),
                             (dict(c, n_layers=128, n_blocks=1), "n_layers is too large for depth reads"),
                             # the keys of Delta AttnRes and GR (docs/delta-gated-spec.md §4): values, and a key
                             # set for another mode, named with the mode
                             (dict(c, residual="delta", delta_gate="tanh"), "unknown value 'tanh' of delta_gate"),
                             (dict(c, residual="delta", delta_value_route="tied"),
                              "unknown value 'tied' of delta_value_route"),
                             (dict(c, residual="delta", delta_null_source=1), "'delta_null_source' must be true or false"),
                             (dict(c, residual="gr", gr_n=1), "gr_n must be 2 to 8 \\(got 1\\)"),
                             (dict(c, residual="gr", gr_rank=-2), "gr_rank must be at least 0"),
                             (dict(c, residual="delta_block", n_blocks=3), "n_blocks \\(3\\) must divide"),
                             (dict(c, delta_null_source=True), "model config key 'delta_null_source' = true applies "
                              "to residual 'delta' or 'delta_block', not to residual mode 'block'"),
                             (dict(c, residual="delta", delta_block_partial=False),
                              "'delta_block_partial' = false applies to residual 'delta_block', not to residual mode 'delta'"),
                             (dict(c, residual="rd", gr_rank=8), "'gr_rank' = 8 applies to residual 'gr', not to "
                              "residual mode 'rd'"),
                             (dict(c, residual="gr", delta_gate="sigmoid_scalar"),
                              "'delta_gate' = \"sigmoid_scalar\" applies to residual 'delta' or 'delta_block', not "
                              "to residual mode 'gr'")):
            with self.assertRaisesRegex(ConfigError, message):
                ModelConfig.from_json(bad, where="x.safetensors")
        # full ignores n_blocks; rd with n_blocks = 2 * n_layers is allowed (one sublayer per block)
        ModelConfig.from_json(dict(c, residual="full", n_blocks=3))
        ModelConfig.from_json(dict(c, residual="rd", n_blocks=8))
        # Every key of the baselines loads, with any residual mode (value_residual composes with every one).
        every = dict(c, residual="denseformer", dwa_dilation=3, dwa_period=2, dwa_weight_decay=False, value_residual=True,
                     vres_mode="learned_pair", vres_lambda1=0.25, vres_lambda2=1, mudd_ways="r", mudd_dynamic=False,
                     mudd_hidden_round=0, mudd_last_expand=1, mudd_gelu="tanh", mudd_sep_qkv_norm=False,
                     mudd_prepost_norm=True, mudd_decay_all=False)
        self.assertEqual(ModelConfig.from_json(json.dumps(every)).to_json(),
                         dict(ModelConfig().to_json(), **dict(every, vres_lambda2=1.0)))
        self.assertEqual(list(ModelConfig.from_json(every).to_json()), list(ModelConfig().to_json()))
        self.assertEqual(ModelConfig.from_json(every).vres_parameters, 2)
        self.assertEqual(ModelConfig.from_json(dict(every, value_residual=False)).vres_parameters, 0)
        # The keys that apply to some modes only (config.MODE_KEYS) are written with every mode, at their defaults
        # with the others, as the C++ writes them.
        self.assertEqual(ModelConfig().to_json()["delta_gate"], "none")
        self.assertEqual({k: v for k, v in ModelConfig().to_json().items() if k.startswith("gr_")},
                         dict(gr_n=4, gr_rank=0, gr_decay_norm=False))
        delta = dict(c, residual="delta_block", delta_null_source=True, delta_gate="sigmoid_vector",
                     delta_value_route="decoupled", delta_block_partial=False, delta_decay_all=False)
        self.assertEqual(ModelConfig.from_json(json.dumps(delta)).to_json(), dict(ModelConfig().to_json(), **delta))
        gr = ModelConfig.from_json(dict(c, residual="gr", gr_n=3, gr_rank=7, gr_decay_norm=True, delta_gate="none"))
        self.assertEqual({k: v for k, v in gr.to_json().items() if k.startswith(("gr_", "delta_"))},
                         dict(gr_n=3, gr_rank=7, gr_decay_norm=True, delta_null_source=False, delta_gate="none",
                              delta_value_route="none", delta_block_partial=True, delta_decay_all=True))
        self.assertEqual((gr.gr_bottleneck, gr.has_prenorm, ModelConfig.from_json(dict(c, residual="gr")).gr_bottleneck),
                         (7, False, 2))


class BenchWorkerTest(unittest.TestCase):
    """bench/torch_model.py (what `attnres bench` runs) drives attnres.bench_worker from python/."""

    def worker(self, *args, module=False):
        env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "PYTHONPATH")}
        if module:
            env["PYTHONPATH"] = os.path.join(support.SOURCE_DIR, "python")
            cmd = [sys.executable, "-m", "attnres.bench_worker", *args]
        else:
            cmd = [sys.executable, os.path.join(support.SOURCE_DIR, "bench", "torch_model.py"), *args]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=support.HERE)
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout.strip().splitlines()[-1])

    def test_probe_and_steps(self):
        probe = self.worker("--probe")
        self.assertEqual(probe["omp_wait_policy"], "PASSIVE")  # set before torch loaded libgomp
        self.assertEqual(probe["precisions"], ["fp32", "bf16"])
        cfg = json.dumps(config_dict("rd", vocab_size=64, max_seq_len=8))
        for precision in ("fp32", "bf16"):
            r = self.worker("--model-json", cfg, "--batch", "2", "--seq", "16", "--steps", "2", "--warmup", "0",
                            "--threads", "1", "--precision", precision, module=precision == "bf16")
            self.assertEqual((r["precision"], r["seq"], len(r["step_ms"])), (precision, 16, 2))
            self.assertEqual(r["omp_wait_policy"], "PASSIVE")
            self.assertEqual(r["params"], sum(int(np.prod(s)) for _, s in
                                              attnres.param_layout(ModelConfig.from_json(cfg))))
            self.assertLess(abs(r["loss_first"] - np.log(64)), 0.1)  # near-uniform at initialisation
        # the baseline arms of `attnres bench` (denseformer, denseformer-4x5, ARM+vres, hc, mhc, mudd) reach the
        # worker as configs (a process each)
        baselines = dict(support.BASELINES)
        for name in ("denseformer_4x5", "rd_vres_convex", "denseformer_vres_pair", "hc", "mhc", "mudd"):
            cfg = json.dumps(config_dict(**dict(baselines[name], vocab_size=64, max_seq_len=8)))
            r = self.worker("--model-json", cfg, "--batch", "1", "--seq", "8", "--steps", "1", "--warmup", "0",
                            "--threads", "1")
            self.assertEqual(r["params"], sum(int(np.prod(s)) for _, s in
                                              attnres.param_layout(ModelConfig.from_json(cfg))), name)

    def test_weight_decay_is_attnres_policy(self):
        """ParamInfo::decay, as the oracle's trainer has it: matrices, DWA weights when dwa_weight_decay, HC's
        w_alpha and w_beta and mHC's phi (not HC's A)."""
        for name, c in all_configs():
            if c["residual"] in ("hc", "mhc", "mudd", "delta", "delta_block", "gr"):
                cfg, config = R.parse_config(c), ModelConfig.from_json(c)
                got = {n for n, s in attnres.param_layout(config) if attnres.model.weight_decayed(config, n, s)}
                self.assertEqual(got, {n for n, t in R.random_params(cfg).items() if R.decayed(cfg, n, t)}, name)
                if c["residual"] in DELTA_MODES:  # the read parameters with delta_decay_all (the released code's)
                    self.assertEqual("layers.1.attn_res.query" in got, c.get("delta_decay_all", True), name)
                    self.assertNotIn("layers.1.attn_norm.weight", got)
                elif c["residual"] == "gr":  # the matrices; the zero-centred norms with gr_decay_norm
                    self.assertTrue({"gr.0.w_down", "gr.0.w_up", "gr.0.w_inject", "gr_final.w_up"} <= got, name)
                    self.assertEqual("gr.3.norm.weight" in got, c.get("gr_decay_norm", False), name)
                elif c["residual"] != "mudd":
                    self.assertEqual(any(n.endswith((".w_beta", ".phi")) for n in got), name != "hc_static", name)
                    self.assertFalse(any(n.endswith(".A") for n in got), name)
                else:  # a: decayed with mudd_decay_all (the default) only
                    self.assertEqual("mudd.0.a" in got, c.get("mudd_decay_all", True), name)
        for decay in (True, False):
            c = config_dict("denseformer", value_residual=True, vres_mode="learned_pair", dwa_weight_decay=decay)
            cfg, config = R.parse_config(c), ModelConfig.from_json(c)
            got = {n for n, s in attnres.param_layout(config) if attnres.model.weight_decayed(config, n, s)}
            want = {n for n, t in R.random_params(cfg).items() if R.decayed(cfg, n, t)}
            self.assertEqual(got, want)
            self.assertEqual(any(n.startswith("dwa.") for n in got), decay)
            # the bench worker's AdamW groups are these
            from attnres.bench_worker import optimizer
            m = attnres.AttnResModel(config)
            groups = optimizer(m).param_groups
            self.assertEqual([g["weight_decay"] for g in groups], [0.1, 0.0])
            self.assertEqual({id(t) for t in groups[0]["params"]}, {id(t) for n, t in m.named_parameters() if n in want})
            self.assertEqual(len(groups[0]["params"]) + len(groups[1]["params"]), len(list(m.parameters())))

    def test_matmul_rate(self):
        """--matmul-rate: the bf16 (or fp32) torch.matmul rate `attnres bench` compares its reference with."""
        r = self.worker("--matmul-rate", "--shapes", "64x48x32,16x16x16", "--reps", "1", "--threads", "1")
        self.assertEqual((r["impl"], r["dtype"], r["threads"]), ("torch", "bf16", 1))
        self.assertEqual([(x["m"], x["n"], x["k"]) for x in r["matmul"]], [(64, 48, 32), (16, 16, 16)])
        for x in r["matmul"]:
            self.assertGreater(x["gflops"], 0)
        self.assertEqual(self.worker("--matmul-rate", "--shapes", "8x8x8", "--dtype", "fp32", "--reps", "1",
                                     "--threads", "1")["dtype"], "fp32")
        bad = subprocess.run([sys.executable, os.path.join(support.SOURCE_DIR, "bench", "torch_model.py"),
                              "--matmul-rate", "--shapes", "8x8"], capture_output=True, text=True)
        self.assertEqual(bad.returncode, 2)
        self.assertIn("--shapes: '8x8' is not MxNxK", bad.stderr)


if __name__ == "__main__":
    unittest.main()
