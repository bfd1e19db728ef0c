#!/usr/bin/python3
"""Self-check of the attnres float64 reference. Run: /usr/bin/python3 tests/reference/test_reference_selfcheck.py"""
import json
import math
import os
import sys
import tempfile
import traceback

import numpy as np
import torch

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import attnres_ref as R  # noqa: E402

T64 = torch.float64


def close(a, b, tol, what=""):
    a, b = torch.as_tensor(a, dtype=T64), torch.as_tensor(b, dtype=T64)
    err = (a - b).abs().max().item()
    assert err <= tol, f"{what}: max abs err {err:.3e} > {tol:.1e}\n got {a}\n want {b}"


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def cfg_of(residual, **kw):
    c = dict(vocab_size=11, d_model=16, n_layers=4, n_heads=2, mlp_hidden=24, residual=residual, n_blocks=2,
             value_route="decoupled", tie_embeddings=False, norm_eps=1e-6, rope_theta=10000.0, max_seq_len=16)
    c.update(kw)
    return R.parse_config(c)


def tokens_of(seed=1, B=2, T=7, V=11):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (B, T + 1), generator=g)


def logits(cfg, P, toks):
    return R.forward(cfg, {n: P[n] for n in R.param_shapes(cfg)}, toks[:, :-1])


# ------------------------------------------------------------------------------------------------ tests
def test_vector_a():
    v = [torch.tensor([1.0, 0, 0, 0]), torch.tensor([0.0, 1, 0, 0])]
    h, alpha = R.depth_read(v, torch.tensor([2.0, 0, 0, 0]), torch.ones(4), 1e-6)
    z0 = 2.0 * (0.25 + 1e-6) ** -0.5
    close(z0, 3.999992, 1e-6, "z0")
    close(alpha, [0.9820136, 0.0179864], 1e-7, "alpha")
    close(h, [0.9820136, 0.0179864, 0, 0], 1e-7, "h")


def test_vector_b_forward_backward():
    v = torch.tensor([[1, -2, 0.5, 3], [0.2, 0.4, -1, 0], [-3, 1, 1, 2]], dtype=T64, requires_grad=True)
    w = torch.tensor([0.5, -0.25, 1, 0.1], requires_grad=True)
    gamma = torch.tensor([1, 2, 0.5, 1.5], dtype=T64, requires_grad=True)
    g = torch.tensor([1, 0, -1, 0.5], dtype=T64)
    h, alpha = R.depth_read(list(v.unbind(0)), w, gamma, 1e-6)
    r = ((v * v).mean(-1) + 1e-6) ** -0.5
    close(r, [0.529812868, 1.825738815, 0.516397711], 2e-9, "r")
    z = ((v * r[:, None]) * w * gamma).sum(-1)
    close(z, [1.165588311, -1.095443289, -0.619677253], 2e-9, "z")
    close(alpha, [0.786166366, 0.081952256, 0.131881378], 2e-9, "alpha")
    close(h, [0.406912683, -1.407670452, 0.443012305, 2.622261854], 2e-9, "h")
    h.backward(g)
    close(v.grad[0], [0.890529627, -0.057744158, -0.658493554, 0.298520584], 2e-9, "dv0")
    close(v.grad[1], [0.075216396, 0.003367939, -0.081952275, 0.039292162], 2e-9, "dv1")
    close(v.grad[2], [0.056184052, 0.122280272, -0.300744596, -0.024313781], 2e-9, "dv2")
    close(w.grad, [1.173149911, -1.799127044, -0.064467343, 0.485410803], 2e-9, "dw")
    close(gamma.grad, [0.586574956, 0.224890880, -0.128934687, 0.032360720], 2e-9, "dgamma")
    h0, a0 = R.depth_read(list(v.detach().unbind(0)), torch.zeros(4), gamma.detach(), 1e-6)
    close(a0, [1 / 3] * 3, 1e-15, "alpha(w=0)")
    close(h0, [-0.6, -0.2, 0.1666667, 1.6666667], 1e-7, "h(w=0)")
    # single source: alpha = 1, dv = g, dw = dgamma = 0
    v1 = torch.tensor([[1.0, -2, 0.5, 3]], requires_grad=True)
    w1 = torch.tensor([0.5, -0.25, 1, 0.1], requires_grad=True)
    h1, _ = R.depth_read([v1[0]], w1, torch.ones(4), 1e-6)
    h1.backward(g)
    close(v1.grad[0], g, 1e-15, "single-source dv")
    close(w1.grad, torch.zeros(4), 1e-15, "single-source dw")


def test_zero_query_invariant():
    toks = tokens_of()
    for tie in (False, True):
        base = dict(norm_eps=1e-12, tie_embeddings=tie)
        P = R.random_params(cfg_of("block", **base), seed=3, std=0.3, query_std=0.0)
        ref = logits(cfg_of("prenorm", **base), P, toks)
        for res, nb in (("block", 2), ("block", 1), ("full", 0)):
            out = logits(cfg_of(res, n_blocks=nb, **base), P, toks)
            e = rel(out, ref)
            assert e < 1e-9, f"{res} n_blocks={nb} tie={tie}: rel err {e:.2e} vs prenorm"
        # and the invariant is not vacuous: nonzero queries change the function
        Pq = R.random_params(cfg_of("block", **base), seed=3, std=0.3, query_std=1.0)
        assert rel(logits(cfg_of("block", **base), Pq, toks), ref) > 1e-3


def test_baseline_invariants():
    """baselines-spec §6.1: DenseFormer at identity = prenorm exactly; value_residual at (0, 1) = without it."""
    toks = tokens_of()
    pre = cfg_of("prenorm")
    P = R.random_params(pre, seed=5, std=0.3)
    ref = logits(pre, P, toks)
    for k, p in ((1, 1), (2, 2), (4, 5)):
        c = cfg_of("denseformer", dwa_dilation=k, dwa_period=p)
        Pd = dict(P)
        for name, shape in R.param_shapes(c).items():
            if name.startswith("dwa."):
                Pd[name] = torch.zeros(shape)
                Pd[name][-1] = 1.0
        assert torch.equal(logits(c, Pd, toks), ref), f"denseformer {k}x{p} at identity != prenorm"
        if k == 1:  # not vacuous: other weights change the function
            Pd["dwa.2.alpha"] = torch.tensor([0.3, -0.2, 0.9])
            assert rel(logits(c, Pd, toks), ref) > 1e-3
    for mode in ("prenorm", "block", "rd", "denseformer"):
        plain = cfg_of(mode)
        Pm = R.random_params(plain, seed=6, std=0.3, query_std=0.5)
        want = logits(plain, Pm, toks)
        c = cfg_of(mode, value_residual=True, vres_mode="constant", vres_lambda1=0.0, vres_lambda2=1.0)
        assert torch.equal(logits(c, Pm, toks), want), f"{mode}: value_residual (0, 1) != without"
        fixed = cfg_of(mode, value_residual=True)
        assert rel(logits(fixed, Pm, toks), want) > 1e-3, f"{mode}: value_residual has no effect"
    assert len([n for n in R.param_shapes(cfg_of("denseformer")) if n.startswith("dwa.")]) == 4
    assert sum(R.param_shapes(cfg_of("denseformer"))[f"dwa.{i}.alpha"][0] for i in range(1, 5)) == 4 * 7 // 2
    pair = R.param_shapes(cfg_of("prenorm", value_residual=True, vres_mode="learned_pair"))
    assert [n for n in pair if "vres" in n] == [f"layers.{i}.attn.vres_lambda" for i in (1, 2, 3)]


def test_rd_controls_match_block():
    toks = tokens_of(2)
    blk = cfg_of("block")
    P = R.random_params(cfg_of("rd", value_route="decoupled"), seed=5, std=0.3, query_std=1.0)
    ref = logits(blk, P, toks)
    # tied: bit for bit
    assert torch.equal(logits(cfg_of("rd", value_route="tied"), P, toks), ref), "rd+tied != block"
    # decoupled / average with value_query == query: bit for bit
    Pc = dict(P)
    for k in range(4):
        Pc[f"layers.{k}.attn_res.value_query"] = P[f"layers.{k}.attn_res.query"].clone()
    assert torch.equal(logits(cfg_of("rd", value_route="decoupled"), Pc, toks), ref), "rd+decoupled(qV=q)"
    assert torch.equal(logits(cfg_of("rd", value_route="average"), Pc, toks), ref), "rd+average(qV=q)"
    # decoupled with value_query = 0 at the spec's initialisation (all queries zero): equals block
    P0 = R.random_params(cfg_of("rd"), seed=6, std=0.3, query_std=0.0)
    ref0 = logits(blk, P0, toks)
    assert torch.equal(logits(cfg_of("rd", value_route="decoupled"), P0, toks), ref0), "rd+decoupled(q=0)"
    assert rel(logits(cfg_of("rd", value_route="frozen"), P0, toks), ref0) < 1e-13, "rd+frozen(q=0)"
    # a nonzero value_query makes decoupled differ from block
    assert rel(logits(cfg_of("rd", value_route="decoupled"), P, toks), ref) > 1e-4


def test_safetensors_roundtrip():
    rng = np.random.default_rng(0)
    t = {"a": rng.standard_normal((3, 5)), "b": rng.standard_normal(7).astype(np.float32),
         "c": rng.integers(-9, 9, (2, 3), dtype=np.int32), "d": rng.integers(0, 2**40, (4,), dtype=np.int64),
         "scalar": np.array(1.25), "empty": np.zeros((0, 3))}
    meta = {"config": json.dumps({"x": 1}), "note": "héllo"}
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t.safetensors")
        R.save_safetensors(path, t, meta)
        with open(path, "rb") as f:
            blob = f.read()
        n = int.from_bytes(blob[:8], "little")
        assert (8 + n) % 8 == 0
        hdr = json.loads(blob[8:8 + n])
        assert hdr["scalar"]["shape"] == [] and hdr["b"]["dtype"] == "F32" and hdr["c"]["dtype"] == "I32"
        back, meta2 = R.load_safetensors(path)
    assert meta2 == meta
    assert set(back) == set(t)
    for k in t:
        assert back[k].dtype == t[k].dtype and back[k].shape == t[k].shape and np.array_equal(back[k], t[k]), k


def test_adamw_matches_torch():
    cfg = cfg_of("rd", value_route="average", tie_embeddings=True)
    P = R.random_params(cfg, seed=7, std=0.3, query_std=0.5)
    toks = tokens_of(3)
    kw = dict(lr=3e-2, weight_decay=0.1, clip=0.5, warmup=2, min_lr_ratio=0.1, schedule="cosine", total_steps=6)
    losses, newP = R.train_adamw(cfg, P, toks, 5, **kw)
    # the same with torch.optim.AdamW + clip_grad_norm_
    Q = {n: t.clone().requires_grad_(True) for n, t in P.items()}
    mats = [t for t in Q.values() if t.dim() == 2]
    vecs = [t for t in Q.values() if t.dim() != 2]
    opt = torch.optim.AdamW([{"params": mats, "weight_decay": 0.1}, {"params": vecs, "weight_decay": 0.0}],
                            lr=3e-2, betas=(0.9, 0.95), eps=1e-8)
    tl = []
    for s in range(5):
        opt.zero_grad()
        loss, _ = R.loss_and_logits(cfg, Q, toks)
        loss.backward()
        tl.append(loss.item())
        torch.nn.utils.clip_grad_norm_(list(Q.values()), 0.5)
        for grp in opt.param_groups:
            grp["lr"] = R.lr_at(s, 3e-2, 2, 6, 0.1, "cosine")
        opt.step()
    close(losses, tl, 1e-12, "losses")
    for n in P:
        close(newP[n], Q[n].detach(), 1e-12, n)
    assert losses[-1] < losses[0]
    # learning-rate schedules, hand-computed
    assert R.lr_at(0, 1.0, warmup=4, total_steps=10) == 0.25
    close(R.lr_at(4, 1.0, 4, 10, 0.1, "cosine"), 1.0, 1e-15)
    close(R.lr_at(7, 1.0, 4, 10, 0.1, "cosine"), 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)), 1e-15)
    # wsd: total 10, decay_fraction 0.25 -> round(2.5) = 3 (half up) -> decay_start 7
    assert [R.lr_at(s, 1.0, 0, 10, 0.0, "wsd", 0.25) for s in (6, 7, 8, 9)] == [1.0, 1.0, 1 - 1 / 3, 1 - 2 / 3]


def test_cli_and_strictness():
    cfg = cfg_of("rd", value_route="decoupled")
    P = R.random_params(cfg, seed=8, std=0.3, query_std=0.5)
    toks = tokens_of(4)
    with tempfile.TemporaryDirectory() as d:
        w, t, o = (os.path.join(d, x) for x in ("w.safetensors", "t.safetensors", "o.safetensors"))
        R.save_safetensors(w, {n: x.numpy().astype(np.float32) for n, x in P.items()}, {"config": json.dumps(cfg)})
        R.save_safetensors(t, {"tokens": toks.numpy().astype(np.int32)})
        assert R.main(["--weights", w, "--tokens", t, "--out", o, "--adamw-steps", "3", "--lr", "1e-2",
                       "--schedule", "wsd", "--clip", "1.0", "--weight-decay", "0.1"]) == 0
        out, _ = R.load_safetensors(o)
        cfg2, P32 = R.load_model(w)
        assert cfg2 == cfg
        Pg = {n: x.clone().requires_grad_(True) for n, x in P32.items()}
        loss, lg = R.loss_and_logits(cfg, Pg, toks)
        loss.backward()
        assert out["logits"].shape == (2, 7, 11) and out["loss"].shape == () and out["losses"].shape == (3,)
        assert all(a.dtype == np.float64 for a in out.values())
        close(out["loss"], loss.item(), 1e-14, "loss")
        close(out["losses"][0], loss.item(), 1e-14, "losses[0]")
        assert set(out) == {"logits", "loss", "losses"} | {"grad." + n for n in P} | {"param." + n for n in P}
        for n in P:
            close(out["grad." + n], Pg[n].grad, 1e-14, n)
        # the very first sublayer reads [b_0] alone: its query, value query and gamma get zero gradient
        for n in ("query", "value_query", "key_norm.weight"):
            assert not out["grad.layers.0.attn_res." + n].any(), n
        assert np.abs(out["grad.layers.1.attn_res.value_query"]).max() > 0
        # strict parameter set and config
        bad = dict(P32)
        del bad["layers.1.attn_res.value_query"]
        bad["junk"] = torch.zeros(1)
        try:
            R.check_params(cfg, bad)
            raise AssertionError("check_params accepted a wrong set")
        except ValueError as e:
            assert "layers.1.attn_res.value_query" in str(e) and "junk" in str(e)
        for badcfg in (dict(cfg, residual="blok"), dict(cfg, value_route="x"), dict(cfg, n_blocks=3)):
            try:
                R.parse_config(badcfg)
                raise AssertionError(f"parse_config accepted {badcfg}")
            except ValueError:
                pass
    assert "attn_res.query" not in " ".join(R.param_shapes(cfg_of("prenorm")))
    assert "layers.0.attn_res.value_query" not in R.param_shapes(cfg_of("rd", value_route="tied"))
    assert "layers.0.attn_res.value_query" not in R.param_shapes(cfg_of("rd", value_route="frozen"))
    assert "layers.0.attn_res.value_query" in R.param_shapes(cfg_of("rd", value_route="average"))
    assert "lm_head.weight" not in R.param_shapes(cfg_of("block", tie_embeddings=True))


def run_tests(namespace):
    """Runs every test_* function of a module namespace; returns the exit status."""
    tests = [(n, f) for n, f in namespace.items() if n.startswith("test_") and callable(f)]
    failed = 0
    for name, f in tests:
        try:
            f()
            print(f"PASS {name}")
        except Exception:
            failed += 1
            print(f"FAIL {name}")
            traceback.print_exc()
    print(f"{len(tests) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(run_tests(globals()))
