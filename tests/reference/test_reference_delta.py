#!/usr/bin/python3
"""Self-check of the reference's Delta AttnRes and Gated Residual (attnres_ref.py) against docs/delta-gated-spec.md:
the float64 test vectors of §3 (computed by the independent hand-written backward below, which must agree with
torch.autograd), the source schedules, and the identity-start invariants of §1.5 and §2.5.
Run: /usr/bin/python3 tests/reference/test_reference_delta.py"""
import os
import sys

import torch

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import attnres_ref as R  # noqa: E402
from test_reference_baselines import checksum, fill, leaf, spec  # noqa: E402
from test_reference_selfcheck import cfg_of, logits, rel, run_tests, tokens_of  # noqa: E402

T64 = torch.float64
EPS = 1e-6


# ------------------------------------------------------------------------------------------------ hand backward
def delta_read_hand(V, x, w, gamma, gate, G, eps=EPS, Wg=None, bg=None):
    """One Delta AttnRes read h = x + g * sum_s alpha_s v_s and its hand-derived backward (spec §1.4), per token.
    V [n, T, d] sources, x [T, d], w / gamma [d]; gate: None (g = 1), ("scalar", logit), ("alpha", a) or
    ("vector",) with Wg [d, d], bg [d] (g = sigmoid(Wg x + bg)). G = dL/dh [T, d]. Returns (h, grads)."""
    n, T, d = V.shape
    r = ((V * V).mean(-1) + eps) ** -0.5  # [n, T]
    N = V * r[..., None]  # normalised keys
    u = w * gamma
    z = (N * u).sum(-1)  # [n, T]
    alpha = torch.softmax(z, 0)
    c = (alpha[..., None] * V).sum(0)  # the correction [T, d]
    if gate is None:
        g = torch.ones(T, 1)
    elif gate[0] == "scalar":
        g = torch.sigmoid(torch.tensor(gate[1])).expand(T, 1)
    elif gate[0] == "alpha":
        g = torch.tensor(gate[1]).expand(T, 1)
    else:
        g = torch.sigmoid(x @ Wg.T + bg)  # [T, d]
    h = x + g * c
    out = {"x": G.clone()}
    dg = G * c  # dL/dg, element-wise
    if gate is not None and gate[0] == "scalar":
        out["gate"] = (dg.sum() * g[0, 0] * (1 - g[0, 0])).reshape(1)
    elif gate is not None and gate[0] == "alpha":
        out["gate"] = dg.sum().reshape(1)
    elif gate is not None:
        dpre = dg * g * (1 - g)
        out["Wg"], out["bg"] = dpre.T @ x, dpre.sum(0)
        out["x"] = out["x"] + dpre @ Wg
    Gc = g * G  # the read's own output gradient (attnres-spec §6 from here)
    cs = (Gc[None] * V).sum(-1)  # [n, T]
    cbar = (alpha * cs).sum(0)
    delta = alpha * (cs - cbar)
    out["V"] = alpha[..., None] * Gc[None] + (delta * r)[..., None] * (u - (z / d)[..., None] * N)
    dn = (delta[..., None] * N).sum((0, 1))
    out["w"], out["gamma"] = dn * gamma, dn * w
    return h, out


def gr_hand(H, nw, Wd, Wu, Wi, y, Gx, GH, eps=EPS):
    """One Gated Residual read + write (spec §2.1) and its hand-derived backward (§2.4), per token. H [T, n, d];
    nw [n d] (zero-centred); Wd [r, n d]; Wu [n d, r]; Wi [n, n d] (None: the final mixer, read only); y [T, d]
    the sublayer output; Gx = dL/dx [T, d], GH = dL/dH' [T, n, d]. Returns (x, H', beta, grads)."""
    T, n, d = H.shape
    r = ((H * H).mean(-1, keepdim=True) + eps) ** -0.5  # [T, n, 1]
    N = H * r
    scale = 1 + nw.view(n, d)
    Hn = N * scale
    Hf = Hn.reshape(T, n * d)
    p = Hf @ Wd.T / n
    sp = torch.sigmoid(p)
    a = p * sp  # silu
    G = torch.sigmoid(a @ Wu.T).view(T, n, d)
    x = (G * Hn).mean(1)
    out = {}
    dHn = (Gx[:, None, :] * G) / n
    dG = (Gx[:, None, :] * Hn) / n
    dq = (dG * G * (1 - G)).reshape(T, n * d)
    out["Wu"] = dq.T @ a
    da = dq @ Wu
    dp = da * sp * (1 + p * (1 - sp))  # silu'(p)
    out["Wd"] = dp.T @ Hf / n
    dHn = dHn + (dp @ Wd).view(T, n, d) / n
    Hp = beta = None
    dH = torch.zeros_like(H)
    if Wi is not None:
        s = Hf @ Wi.T / n
        beta = 2 * torch.sigmoid(s)  # [T, n]
        Hp = H + beta[..., None] * y[:, None, :]
        dH = GH.clone()
        dbeta = (GH * y[:, None, :]).sum(-1)
        out["y"] = (beta[..., None] * GH).sum(1)
        ds = dbeta * beta * (1 - beta / 2)  # d(2 sigmoid(s))/ds = 2 sigma (1 - sigma)
        out["Wi"] = ds.T @ Hf / n
        dHn = dHn + (ds @ Wi).view(T, n, d) / n
    out["nw"] = (dHn * N).sum(0).reshape(n * d)
    dN = dHn * scale
    dH = dH + r * (dN - (N * dN).sum(-1, keepdim=True) / d * N)
    out["H"] = dH
    return x, Hp, beta, out


def worst(got, want):
    return max((got[k] - want[k]).abs().max().item() for k in want)


# ------------------------------------------------------------------------------------------------ the vectors
def delta_case(gate=None, null=False):
    """Spec §3 part F: n = 3 sources (the first a learned null source when `null`), T = 2, d = 4."""
    V = fill(90, (3, 2, 4))
    if null:  # the null source: one learned vector for every token
        V = V.clone()
        V[0] = fill(95, (4,), 0.5).expand(2, 4)
    x, w, gamma = fill(91, (2, 4)), fill(92, (4,), 0.5), 1 + fill(93, (4,), 0.25)
    return V, x, w, gamma, fill(94, (2, 4))


def autograd_delta(V, x, w, gamma, G, gate=None, null=False, Wg=None, bg=None):
    """The same read through the reference (delta_read) and autograd. With `null`, source 0 is one learned
    vector for every token (V[0, 0]): its gradient is returned as grads["null"]."""
    L = dict(x=leaf(x), w=leaf(w), gamma=leaf(gamma))
    if null:
        L["null"], L["V"] = leaf(V[0, 0]), leaf(V[1:])
        sources = [L["null"].expand(2, 4)] + list(L["V"].unbind(0))
    else:
        L["V"] = leaf(V)
        sources = list(L["V"].unbind(0))
    c, alpha = R.delta_read(sources, L["w"], L["gamma"], EPS)
    if gate is None:
        g = 1.0
    elif gate[0] == "scalar":
        L["gate"] = leaf(torch.tensor([gate[1]]))
        g = torch.sigmoid(L["gate"])
    elif gate[0] == "alpha":
        L["gate"] = leaf(torch.tensor([gate[1]]))
        g = L["gate"]
    else:
        L["Wg"], L["bg"] = leaf(Wg), leaf(bg)
        g = torch.sigmoid(L["x"] @ L["Wg"].T + L["bg"])
    h = L["x"] + g * c
    (h * G).sum().backward()
    return h, alpha, {k: t.grad for k, t in L.items()}


GATES = ((None, False), (("scalar", -2.0), True), (("alpha", 0.3), False), (("vector",), True))


def delta_vectors(gate, null):
    """(h, alpha, autograd grads, max |hand - autograd|) of one part-F case."""
    V, x, w, gamma, G = delta_case(gate, null)
    Wg, bg = fill(96, (4, 4), 0.5), fill(97, (4,), 0.5) - 2
    h, hand = delta_read_hand(V, x, w, gamma, gate, G, Wg=Wg, bg=bg)
    h2, alpha, auto = autograd_delta(V, x, w, gamma, G, gate, null, Wg, bg)
    if null:  # the null source is one parameter: its gradient sums over the tokens
        hand["null"], hand["V"] = hand["V"][0].sum(0), hand["V"][1:]
    return h2, alpha, auto, max((h - h2).abs().max().item(), worst(hand, auto))


def test_f_delta_read_vectors():
    """The hand backward agrees with autograd, and both with the printed vectors (spec §3, part F)."""
    errs = []
    for gate, null in GATES:
        h, alpha, auto, err = delta_vectors(gate, null)
        errs.append(err)
        if gate is None:  # F1: no gate, no null source
            spec("F1 alpha", alpha, [0.2661313651, 0.2166841099, 0.4281582224, 0.4422872176, 0.3057104124,
                                     0.3410286724])
            spec("F1 h", h, [0.04627948412, -0.4861615477, 0.4604969761, 0.2733716588, 0.3621455511,
                             -1.422744086, 0.1998295994, 0.5510881446])
            spec("F1 g_x", auto["x"], [0.75, -0.25, 0.25, 0.875, 0.25, -0.875, 0.375, 0.5])
            spec("F1 g_w", auto["w"], [0.6486934022, -0.3447086614, 0.2458898439, 0.670640299])
            spec("F1 g_gamma", auto["gamma"], [0.04805136312, 0.1340533683, -0.03688347658, 0.095805757])
            spec("F1 g_V[0:4]", auto["V"].reshape(-1)[:4], [0.1997904992, -0.07294388342, 0.06199689873,
                                                          0.2340197661])
            spec("F1 checksum(g_V)", checksum(auto["V"]), 0.2060675772)
        elif gate[0] == "scalar":  # F2: sigmoid_scalar gate at its initial logit -2, null source
            spec("F2 alpha", alpha, [0.5754257888, 0.4329986447, 0.247707738, 0.3201485569, 0.1768664732,
                                     0.2468527984])
            spec("F2 h", h, [0.8270248885, -0.1956742683, 0.3821015737, 0.9610584122, 0.392587392,
                             -0.8338549093, 0.4775556632, 0.635870854])
            spec("F2 g_logit", auto["gate"], [0.02129541134])
            spec("F2 g_null", auto["null"], [0.06887296994, -0.06230323247, 0.03751304211, 0.08993075406])
            spec("F2 g_w", auto["w"], [0.06096859323, -0.02309468241, -0.06569209651, 0.07350695534])
            spec("F2 g_gamma", auto["gamma"], [0.004516192091, 0.008981265381, 0.009853814476, 0.01050099362])
            spec("F2 checksum(g_V)", checksum(auto["V"]), 0.03092529924)
        elif gate[0] == "alpha":  # F3: learnable_alpha 0.3
            spec("F3 h", h, [0.6263838452, -0.2333484643, 0.4006490928, 0.7820114976, 0.3711436653,
                             -0.9518232257, 0.4099488798, 0.6028264434])
            spec("F3 g_alpha", auto["gate"], [-0.7097579197])
            spec("F3 g_w", auto["w"], [0.1946080206, -0.1034125984, 0.07376695316, 0.2011920897])
            spec("F3 checksum(g_V)", checksum(auto["V"]), 0.06182027315)
        else:  # F4: sigmoid_vector gate, null source
            spec("F4 h", h, [0.8343997941, -0.1895924728, 0.3815357764, 0.9199348522, 0.3934523489,
                             -0.8344336528, 0.4847606859, 0.6480164669])
            spec("F4 g_x", auto["x"], [0.7539766775, -0.229761168, 0.2585290758, 0.8591067561, 0.276782295,
                                       -0.889297699, 0.4067926273, 0.4715474671])
            spec("F4 g_null", auto["null"], [0.06561994294, -0.0611323936, 0.03083025878, 0.185793138])
            spec("F4 g_bg", auto["bg"], [-0.02334223507, 0.07940087999, -0.003797519326, -0.04428334354])
            spec("F4 checksum(g_Wg)", checksum(auto["Wg"]), 0.1379665934)
            spec("F4 checksum(g_V)", checksum(auto["V"]), 0.06298182669)
    assert max(errs) < 1e-14, f"hand backward vs autograd: {errs}"


def gr_case(n=3, d=4, r=2, final=False):
    H = fill(100, (2, n, d))
    nw, Wd, Wu = fill(101, (n * d,), 0.25), fill(102, (r, n * d), 0.5), fill(103, (n * d, r), 0.5)
    Wi = None if final else fill(104, (n, n * d), 0.5)
    return H, nw, Wd, Wu, Wi, fill(105, (2, d)), fill(106, (2, d)), fill(107, (2, n, d))


def test_g_gated_residual_vectors():
    """GR read + write (spec §3, part G): hand backward vs autograd and the printed vectors."""
    errs = []
    for final in (False, True):
        H, nw, Wd, Wu, Wi, y, Gx, GH = gr_case(final=final)
        x, Hp, beta, hand = gr_hand(H, nw, Wd, Wu, Wi, y, Gx, GH)
        L = dict(H=leaf(H), nw=leaf(nw), Wd=leaf(Wd), Wu=leaf(Wu), y=leaf(y))
        x2, Hn, Gt = R.gr_read(L["H"], L["nw"], L["Wd"], L["Wu"], EPS)
        loss = (x2 * Gx).sum()
        if not final:
            L["Wi"] = leaf(Wi)
            Hp2, beta2 = R.gr_write(L["H"], Hn, L["Wi"], L["y"])
            loss = loss + (Hp2 * GH).sum()
            errs.append(max((Hp - Hp2).abs().max().item(), (beta - beta2).abs().max().item()))
        loss.backward()
        auto = {k: t.grad for k, t in L.items() if t.grad is not None}
        errs.append(max((x - x2).abs().max().item(), worst(hand, auto)))
        spec("G x", x2, [0.1645879309, 0.180169179, -0.3213867265, 0.3711744692, 0.05229923318, 0.3473215955,
                         0.351438117, -0.05663976205])
        spec("G read gates G[token0]", Gt[0], [0.4970457674, 0.4995284706, 0.4976561208, 0.4993758781,
                                               0.5020249484, 0.5135472772, 0.5074751584, 0.4917483189,
                                               0.498127642, 0.5107472638, 0.4925248416, 0.4858290802])
        spec("G checksum(g_Wd)", checksum(auto["Wd"]), -0.03195386123)
        spec("G checksum(g_Wu)", checksum(auto["Wu"]), -0.01524714657)
        if not final:  # G1: read and write
            spec("G1 write gates beta", beta2, [0.7205906454, 1.088459969, 1.305482998, 1.05679189, 0.712408554,
                                                1.061771943])
            spec("G1 checksum(H')", checksum(Hp2), -2.014984889)
            spec("G1 g_H[token0]", auto["H"][0], [-0.5840514174, 0.4136868249, -0.975840062, -0.4768081312,
                                                  -0.792324132, -0.06698349796, -0.9213728923, -0.4588824174,
                                                  -0.8054630543, -0.990479043, 0.4252245264, -0.541581443])
            spec("G1 checksum(g_H)", checksum(auto["H"]), -5.258089514)
            spec("G1 g_y", auto["y"], [-2.754238289, -0.6919284694, -1.183436994, -2.065678717, -0.2289280459,
                                       -2.210570138, 0.1810573737, -0.7167661005])
            spec("G1 g_norm[0:4]", auto["nw"][:4], [0.09212863623, 0.2613002164, -0.1684466482, 0.05303645364])
            spec("G1 checksum(g_norm)", checksum(auto["nw"]), -0.03668391637)
            spec("G1 checksum(g_Wi)", checksum(auto["Wi"]), 0.7913917329)
        else:  # G2: the final mixer (read only)
            spec("G2 checksum(g_H)", checksum(auto["H"]), 0.4226041346)
            spec("G2 checksum(g_norm)", checksum(auto["nw"]), -0.05403353409)
    assert max(errs) < 1e-14, f"hand backward vs autograd: {errs}"


# ------------------------------------------------------------------------------------------------ the wiring
def test_source_schedules():
    """Spec §1.1: per-sublayer deltas; Delta Block with the current block's partial sum (the default) and the
    released code's schedule (completed blocks only, each from the sublayer after the next block's first)."""
    outs = list(range(100, 112))
    delta = cfg_of("delta", n_layers=6)
    assert [R.delta_sources(delta, j, 0, outs)[1] for j in (0, 1, 2, 5)] == [[], [-1, 0], [-1, 0, 1],
                                                                            [-1, 0, 1, 2, 3, 4]]
    blk = cfg_of("delta_block", n_layers=6, n_blocks=3)  # blocks of 4 sublayers
    assert [R.delta_sources(blk, j, 0, outs)[1] for j in range(12)] == [
        [], [-1, 0], [-1, 1], [-1, 2], [-1, 3], [-1, 3, 4], [-1, 3, 5], [-1, 3, 6], [-1, 3, 7], [-1, 3, 7, 8],
        [-1, 3, 7, 9], [-1, 3, 7, 10]]
    code = cfg_of("delta_block", n_layers=6, n_blocks=3, delta_block_partial=False)
    assert [R.delta_sources(code, j, 0, outs)[1] for j in range(12)] == [
        [], [-1], [-1], [-1], [-1], [-1, 3], [-1, 3], [-1, 3], [-1, 3], [-1, 3, 7], [-1, 3, 7], [-1, 3, 7]]
    # the block sums are the sums of the block's outputs (here integers): block 2 after sublayer 6 = 104+105+106
    t, ids = R.delta_sources(blk, 7, torch.zeros(1), [torch.tensor(float(v)) for v in outs])
    assert [float(v) for v in t] == [0.0, 406.0, 315.0] and ids == [-1, 3, 6]
    # with the partial sum, the sources of every read sum to the running stream (spec §1.5)
    for cfg in (delta, blk):
        for j in range(1, 12):
            t, _ = R.delta_sources(cfg, j, torch.tensor(1000.0), [torch.tensor(float(v)) for v in outs])
            assert float(sum(t)) == 1000.0 + sum(outs[:j])


def test_delta_invariants():
    """Spec §1.5: at zero queries (and zero null sources) every read adds the mean of its sources, (1/n) x_j,
    so h_j = (1 + 1/n) x_j and the model computes pre-norm's function up to epsilon; learnable_alpha at 0 is
    pre-norm bit for bit; delta_block with one sublayer per block is delta bit for bit; the V route with the
    Q/K route's query and key norm is the mode without it bit for bit."""
    toks = tokens_of()
    for tie in (False, True):
        base = dict(norm_eps=1e-12, tie_embeddings=tie)
        pre = cfg_of("prenorm", **base)
        P = R.random_params(cfg_of("delta", delta_null_source=True, delta_gate="sigmoid_scalar", **base), seed=3,
                            std=0.3, query_std=0.0)
        for n in list(P):
            if n.endswith("null_source"):
                P[n] = torch.zeros_like(P[n])
        ref = logits(pre, P, toks)
        for kw in (dict(residual="delta"), dict(residual="delta", delta_null_source=True),
                   dict(residual="delta", delta_gate="sigmoid_scalar", delta_null_source=True),
                   dict(residual="delta_block"), dict(residual="delta_block", n_blocks=1)):
            c = cfg_of(**dict(base, **kw))
            e = rel(logits(c, P, toks), ref)
            assert e < 1e-9, f"{kw}: rel err {e:.2e} vs prenorm"
        # not vacuous: nonzero queries, or the released code's Delta Block schedule, change the function
        Pq = R.random_params(cfg_of("delta", **base), seed=3, std=0.3, query_std=1.0)
        assert rel(logits(cfg_of("delta", **base), Pq, toks), logits(pre, Pq, toks)) > 1e-3
        assert rel(logits(cfg_of("delta_block", delta_block_partial=False, **base), P, toks), ref) > 1e-3
    pre = cfg_of("prenorm")
    c = cfg_of("delta_block", delta_gate="learnable_alpha", delta_null_source=True)
    P = R.random_params(c, seed=4, std=0.3, query_std=1.0)
    for n in list(P):
        if n.endswith("gate_alpha"):
            P[n] = torch.zeros(1)
    assert torch.equal(logits(c, P, toks), logits(pre, P, toks)), "learnable_alpha = 0 != prenorm"
    P = R.random_params(cfg_of("delta", delta_value_route="decoupled", delta_null_source=True), seed=5, std=0.3,
                        query_std=1.0)
    ref = logits(cfg_of("delta", delta_null_source=True), P, toks)
    assert torch.equal(logits(cfg_of("delta_block", n_blocks=8, delta_null_source=True), P, toks), ref)
    Pv = dict(P)
    for k in range(4):
        Pv[f"layers.{k}.attn_res.value_query"] = P[f"layers.{k}.attn_res.query"]
        Pv[f"layers.{k}.attn_res.value_key_norm.weight"] = P[f"layers.{k}.attn_res.key_norm.weight"]
    v = cfg_of("delta", delta_value_route="decoupled", delta_null_source=True)
    assert torch.equal(logits(v, Pv, toks), ref), "V route = Q/K route != delta"
    assert rel(logits(v, P, toks), ref) > 1e-3


def test_gr_invariant():
    """Spec §2.5: with W_up = 0 (read gates 1/2), W_inject = 0 (write gates 1) and zero-centred norm weights 0,
    every branch stays pre-norm's stream and every read is RMSNorm(x) / 2: GR computes pre-norm's function with
    every norm weight 1/2 (W_down arbitrary)."""
    toks = tokens_of()
    for n in (2, 3, 4):
        c = cfg_of("gr", gr_n=n, tie_embeddings=n == 3)
        P = R.random_params(c, seed=6, std=0.3)
        for k in list(P):
            if k.endswith(("w_up", "w_inject")):
                P[k] = torch.zeros_like(P[k])
            elif k.endswith("norm.weight"):
                P[k] = torch.zeros_like(P[k])
        pre = cfg_of("prenorm", tie_embeddings=n == 3)
        Pp = dict(P)
        for k, shape in R.param_shapes(pre).items():
            if k.endswith("norm.weight"):
                Pp[k] = torch.full(shape, 0.5)
        e = rel(logits(c, P, toks), logits(pre, Pp, toks))
        assert e < 1e-13, f"gr n={n}: rel err {e:.2e} vs prenorm with norm weights 1/2"
        P["gr.3.w_up"] = fill(110, P["gr.3.w_up"].shape, 0.5)
        assert rel(logits(c, P, toks), logits(pre, Pp, toks)) > 1e-4


def test_parameters_and_decay():
    """Spec §1.7 and §2.7: names, shapes, what is decayed; GR has no pre-norms and no final norm."""
    s = R.param_shapes(cfg_of("delta", delta_null_source=True, delta_gate="sigmoid_vector",
                              delta_value_route="decoupled"))
    assert [n for n in s if n.startswith("layers.1.") and "_res" in n] == [
        "layers.1.attn_res.query", "layers.1.attn_res.key_norm.weight", "layers.1.attn_res.value_query",
        "layers.1.attn_res.value_key_norm.weight", "layers.1.attn_res.null_source", "layers.1.attn_res.gate.weight",
        "layers.1.attn_res.gate.bias", "layers.1.mlp_res.query", "layers.1.mlp_res.key_norm.weight",
        "layers.1.mlp_res.null_source", "layers.1.mlp_res.gate.weight", "layers.1.mlp_res.gate.bias"]
    assert "final_res.query" not in s and "final_norm.weight" in s
    g = R.param_shapes(cfg_of("gr", gr_n=3))
    assert not [n for n in g if n.endswith(("attn_norm.weight", "mlp_norm.weight"))] and "final_norm.weight" not in g
    assert g["gr.0.w_down"] == (2, 48) and g["gr.7.w_inject"] == (3, 48) and g["gr_final.w_up"] == (48, 2)
    assert "gr_final.w_inject" not in g
    assert R.gr_rank(cfg_of("gr", d_model=576, n_heads=9)) == 72 and R.gr_rank(cfg_of("gr", gr_rank=5)) == 5
    for all_ in (True, False):
        c = cfg_of("delta", delta_gate="sigmoid_vector", delta_decay_all=all_)
        P = R.random_params(c)
        dec = {n for n, t in P.items() if R.decayed(c, n, t)}
        assert ("layers.0.attn_res.query" in dec) == all_ and "layers.0.mlp_res.gate.weight" in dec
        assert "layers.0.attn_norm.weight" not in dec and "layers.0.attn.wq.weight" in dec
    for dn in (False, True):
        c = cfg_of("gr", gr_decay_norm=dn)
        dec = {n for n, t in R.random_params(c).items() if R.decayed(c, n, t)}
        assert {"gr.0.w_down", "gr.0.w_up", "gr.0.w_inject", "gr_final.w_up"} <= dec
        assert ("gr.0.norm.weight" in dec) == dn


if __name__ == "__main__":
    sys.exit(run_tests(globals()))
