#!/usr/bin/python3
"""Self-check of the reference's baseline residual-mixing ops (attnres_ref.py) against the float64 test
vectors of shared/docs/baselines-spec.md, gradients by torch.autograd.
Run: /usr/bin/python3 tests/reference/test_reference_baselines.py"""
import os
import sys

import torch

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import attnres_ref as R  # noqa: E402
from test_reference_selfcheck import run_tests  # noqa: E402

T64 = torch.float64
EPS = 1e-6


def fill(seed, shape, scale=1.0):
    """Spec §0: element m = scale * (((m^3 + 3m^2 + 5m + 11 seed) mod 17) - 8) / 8 (int64)."""
    n = 1
    for s in shape:
        n *= s
    m = torch.arange(n, dtype=torch.int64)
    q = (m ** 3 + 3 * m ** 2 + 5 * m + 11 * seed) % 17
    return (scale * (q - 8).to(T64) / 8).reshape(shape)


def checksum(t):
    return float((t.detach().reshape(-1) * fill(99, (t.numel(),))).sum())


def spec(what, got, want):
    """|a - b| <= 1e-9 max(1, |b|)."""
    got = torch.as_tensor(got, dtype=T64).detach().reshape(-1)
    want = torch.as_tensor(want, dtype=T64).reshape(-1)
    assert got.shape == want.shape, f"{what}: {got.shape} vs {want.shape}"
    err = ((got - want).abs() / want.abs().clamp(min=1)).max().item()
    assert err <= 1e-9, f"{what}: max err {err:.2e}\n got {got.tolist()}\n want {want.tolist()}"


def leaf(t):
    return t.clone().requires_grad_(True)


# ------------------------------------------------------------------------------------------------ tests
def test_fill():
    assert fill(1, (5,)).tolist() == [0.375, -0.625, -0.125, 0.5, -0.125]


def test_a1_dwa():
    X, alpha = leaf(fill(1, (3, 2, 4))), leaf(fill(2, (3,), 0.5))
    Y = R.dwa(list(X.unbind(0)), alpha)
    (Y * fill(3, (2, 4))).sum().backward()
    spec("A1 Y", Y, [-0.1171875, -0.046875, -0.03125, 0.0078125, -0.3828125, -0.0625, -0.1484375, -0.1640625])
    spec("A1 galpha", alpha.grad, [-0.703125, -0.90625, 0.6875])
    spec("A1 checksum(gX)", checksum(X.grad), -0.5927734375)


def test_a2_a3_schedule_and_wiring():
    assert {i: R.dwa_sources(i, 4, 5) for i in range(1, 13) if R.dwa_sources(i, 4, 5)} == {5: [1, 5], 10: [2, 6, 10]}
    assert {i: R.dwa_sources(i, 2, 3) for i in range(1, 7) if R.dwa_sources(i, 2, 3)} == {3: [1, 3], 6: [0, 2, 4, 6]}
    assert [R.dwa_sources(i, 4, 1) for i in (4, 5, 12)] == [[0, 4], [1, 5], [0, 4, 8, 12]]
    E = leaf(fill(4, (2, 3)))
    W = {i: leaf(fill(9 + i, (3, 3), 0.5)) for i in range(1, 7)}
    alpha = {i: leaf(fill(19 + i, (len(R.dwa_sources(i, 2, 3)),), 0.5)) for i in (3, 6)}
    X, Y = [E], E
    for i in range(1, 7):
        X.append(Y + torch.tanh(Y @ W[i]))
        Y = R.dwa([X[j] for j in R.dwa_sources(i, 2, 3)], alpha[i]) if i in alpha else X[i]
    (Y * fill(5, (2, 3))).sum().backward()
    spec("A3 Y_6", Y, [-0.08937589472, 0.03911611806, 0.003135514519, -0.0220635744, -0.1613059804, -0.02244599335])
    spec("A3 g_E", E.grad, [-0.04976639262, -0.06998857977, -0.09694935768, 0.1896973453, 0.03245002933,
                            0.1240675883])
    spec("A3 galpha_3", alpha[3].grad, [0.03516212308, 0.08679989646])
    spec("A3 galpha_6", alpha[6].grad, [-0.234375, 0.576533714, 0.0208877912, -0.03104126342])
    spec("A3 checksum(gW_1)", checksum(W[1].grad), -0.6409410115)
    spec("A3 checksum(gW_6)", checksum(W[6].grad), 0.1155304668)


def mudd_case(C, prepost, gelu="erf"):
    """Part B: S = 3, T = 2, d = 4, K = 6. Returns (streams, dw, leaves)."""
    L = dict(Xs=leaf(fill(30, (3, 2, 4))), W1=leaf(fill(31, (4, 6), 0.5).T.contiguous()),
             W2=leaf(fill(32, (6, C * 3), 0.5).T.contiguous()), a=leaf(fill(33, (C, 3), 0.5)),
             gsrc=leaf(1 + fill(34, (3, 4), 0.25)), ggen=leaf(1 + fill(35, (4,), 0.25)), gpost=leaf(fill(36, (4,), 0.5)))
    Xs = list(L["Xs"].unbind(0))
    src = [R.rms_norm(Xs[j], L["gsrc"][j], EPS) for j in range(3)] if prepost else Xs
    streams, dw = R.mudd_da(src, Xs[2], L["W1"], L["W2"], L["a"], EPS, gelu,
                            L["ggen"] if prepost else None, L["gpost"] if prepost else None)
    st = torch.stack(streams)
    (st * fill(37, (C, 2, 4))).sum().backward()
    return st, dw, L


def test_b_mudd():
    st, dw, L = mudd_case(4, False)
    spec("B1 dw[token0]", dw[0], [0.04611576531, 0.4320815975, -0.3301237787, 0.2659575151, -0.4988286486,
                                  0.2862434209, -0.1990744185, -0.2728904059, -0.2012033515, -0.2233888879,
                                  0.2581028403, -0.1995679896])
    spec("B1 x_Q[token0]", st[0, 0], [-0.1107535798, -0.1286595611, -0.03488493387, 0.04429676261])
    spec("B1 x_R[token1]", st[3, 1], [-0.1511996958, -0.05533539114, 0.08249340455, -0.0355371662])
    spec("B1 checksum(streams)", checksum(st), 1.029644165)
    spec("B1 g_a", L["a"].grad, [-1.578125, -0.71875, 0.875, 1.265625, -1.828125, -1.96875, 1.8125, -0.890625,
                                 -1.609375, -0.453125, -0.09375, 0.984375])
    spec("B1 g_X2", L["Xs"].grad[2], [-0.4976619409, -0.4291454129, -0.4802677857, 0.393430469, -0.4238307422,
                                      0.02315639351, -0.4978907911, -0.1371500562])
    spec("B1 checksum(gW1)", checksum(L["W1"].grad.T), -0.4133694575)
    spec("B1 checksum(gW2)", checksum(L["W2"].grad.T), -1.316734764)
    st, dw, L = mudd_case(4, False, "tanh")
    spec("B2 dw[token0][0:2]", dw[0].reshape(-1)[:2], [0.0460904828, 0.4321515878])
    spec("B2 checksum(streams)", checksum(st), 1.029955380)
    spec("B2 checksum(gW1)", checksum(L["W1"].grad.T), -0.4127722351)
    st, dw, L = mudd_case(4, True)
    spec("B3 x_Q[token0]", st[0, 0], [-0.7225062748, -0.2759235819, 1.065066892, -0.5473528742])
    spec("B3 checksum(streams)", checksum(st), 0.3105287989)
    spec("B3 g_X2[0:4]", L["Xs"].grad[2, 0], [2.448539524, 1.535561621, 0.7889528117, 0.3213836932])
    spec("B3 g_gamma_gen", L["ggen"].grad, [-0.1069005332, -0.2471860726, -0.7481348679, 0.004008295717])
    spec("B3 g_gamma_post", L["gpost"].grad, [-1.36706748, -0.7617552488, 1.385518729, -0.3724244126])
    spec("B3 checksum(g_gamma_src)", checksum(L["gsrc"].grad), 0.3703132639)
    spec("B3 checksum(gW2)", checksum(L["W2"].grad.T), -3.709317405)
    st, dw, L = mudd_case(1, True)
    spec("B4 dw[token0]", dw[0], [-0.07727307837, 0.3361693135, -0.2097980334])
    spec("B4 g_a", L["a"].grad, [1.551555173, 0.4563029713, -0.1517209515])
    assert R.mudd_hidden_width(4, 16, 1, 64) == 128 and R.mudd_hidden_width(1, 17, 4, 64) == 128
    assert R.mudd_hidden_width(4, 3, 1, 0) == 12


def test_c1_hyper_connection():
    for dynamic in (True, False):
        H, A, B = leaf(fill(40, (2, 3, 4))), leaf(fill(41, (3, 4), 0.5)), leaf(1 + fill(42, (3,), 0.25))
        Wa, wb = leaf(fill(43, (4, 4), 0.5).T.contiguous()), leaf(fill(44, (4,), 0.5))
        sa, sb, gamma = leaf(torch.tensor(0.3)), leaf(torch.tensor(-0.2)), leaf(1 + fill(45, (4,), 0.25))
        dyn = dict(w_alpha=Wa, w_beta=wb, s_alpha=sa, s_beta=sb, norm=gamma) if dynamic else {}
        alpha, beta = R.hc_coefficients(H, A, B, EPS, **dyn)
        h0 = R.stream_read(H, alpha)
        Hp = R.stream_write(H, alpha, beta, torch.zeros(2, 4))
        ((h0 * fill(48, (2, 4))).sum() + (Hp * fill(49, (2, 3, 4))).sum() + (beta * fill(47, (2, 3))).sum()).backward()
        tag = "C1" if dynamic else "C1'"
        if dynamic:
            spec("C1 alpha[token0]", alpha[0], [0.1677261041, -0.3271209946, -0.04073875282, 0.2783365997,
                                                -0.1591523972, 0.5381694783, -0.1272745506, -0.02106562629,
                                                -0.1303834656, -0.2592563165, 0.737977391, 0.03155873234])
            spec("C1 beta", beta, [0.8417776637, 1.03231341, 1.301404935, 0.8540347778, 1.255215441, 1.235769171])
            spec("C1 h0", h0, [0.03818439258, 0.03320680204, 0.03221489008, -0.01323381011, -0.1307288995,
                               -0.0782593047, 0.0561103873, -0.07039021884])
            spec("C1 checksum(H')", checksum(Hp), 0.3735944593)
            spec("C1 g_H[token0]", H.grad[0], [-0.5017748256, -0.07940264969, -0.09900490005, -0.1340839795,
                                               0.203146635, -0.5278503079, -0.005329548636, 0.3435535774,
                                               -0.09072468203, 0.6575204868, -0.112334476, 0.268517863])
            spec("C1 g_s", [sa.grad, sb.grad], [4.067818101, 1.056446722])
            spec("C1 g_w_beta", wb.grad, [-0.01554097997, 0.4338517896, -0.1824280042, 0.01282438942])
            spec("C1 g_gamma", gamma.grad, [-0.1570714261, 0.08775852576, 0.3854490816, 0.2443710593])
            spec("C1 checksum(gW_alpha)", checksum(Wa.grad.T), 2.438397893)
        else:
            spec("C1' h0", h0, [-0.0859375, 0.0390625, 0, -0.171875, -0.28125, -0.1953125, 0.1015625, -0.15625])
            spec("C1' checksum(H')", checksum(Hp), 0.416015625)
        spec(tag + " g_A", A.grad, [-2.25, 0.5, 0.984375, -1.03125, -0.296875, 0.796875, 0.03125, -0.078125, -0.5,
                                    -0.640625, 1.296875, 0.4375])
        spec(tag + " g_B", B.grad, [-0.125, 0.375, -0.25])


def test_d1_sinkhorn():
    Z, G = leaf(fill(50, (4, 4), 2.0)), fill(51, (4, 4))
    M = R.sinkhorn(Z, 20, "col_row")
    (M * G).sum().backward()
    spec("D1 col-row M[0:4]", M[0], [0.08316333421, 0.541930384, 0.03582262033, 0.3390836614])
    spec("D1 col-row column sums", M.sum(0), [0.9999983855, 1.000000878, 1.000000055, 1.000000681])
    spec("D1 col-row gZ[0:4]", Z.grad[0], [-0.06317667962, 0.2601943421, 0.0477842883, -0.2448018737])
    for order, iters, m, gz in (("row_col", 20, [0.08316377616, 0.5419300319], [-0.06317715233, 0.2601944737]),
                                ("col_row", 1, [0.05515413007, 0.5482347614, 0.03425728587, 0.3623538227],
                                 [-0.04587288257, 0.2558557035, 0.04268744668, -0.3177690284]),
                                ("row_col", 1, [0.07824817458, 0.5071199371, 0.02871679715, 0.3014814013], None)):
        Z.grad = None
        M = R.sinkhorn(Z, iters, order)
        (M * G).sum().backward()
        spec(f"D1 {order} t={iters} M", M[0, :len(m)], m)
        if gz is not None:
            spec(f"D1 {order} t={iters} gZ", Z.grad[0, :len(gz)], gz)


def test_d2_mhc_module():
    x, phi = leaf(fill(60, (2, 3, 2))), leaf(fill(61, (6, 15), 0.5).T.contiguous())
    alpha, b, y = leaf(torch.tensor([0.7, -0.4, 1.3])), leaf(fill(62, (15,), 0.5)), leaf(fill(65, (2, 2)))
    pre, post, res = R.mhc_coefficients(x, phi, alpha, b, EPS)
    h = R.mhc_read(x, pre)
    xp = R.mhc_write(x, post, res, y)
    ((h * fill(66, (2, 2))).sum() + (xp * fill(64, (2, 3, 2))).sum()).backward()
    spec("D2 H_pre", pre, [0.4116225398, 0.4472948044, 0.5361422617, 0.3188070367, 0.2582777343, 0.5005014466])
    spec("D2 H_post", post, [0.9274998197, 1.327818893, 0.8425288776, 0.7503311547, 1.368850822, 1.101828525])
    spec("D2 H_res[token0]", res[0], [0.5162954288, 0.1262224749, 0.3574820963, 0.2935474581, 0.4704042185,
                                      0.2360483233, 0.1901571131, 0.4033733066, 0.4064695804])
    spec("D2 h_in", h, [0.5545761714, -0.1806471601, -0.06612865094, 0.506508392])
    spec("D2 x'[token0]", xp[0], [-0.3034146279, -0.09955107097, -0.7650678023, 0.463629267, -0.3921342114,
                                  0.1603837016])
    spec("D2 g_x[token0]", x.grad[0], [-0.2563183937, 0.4790411348, -0.2057333455, 0.1970261702, -0.1991826632,
                                       0.307432424])
    spec("D2 g_y", y.grad, [-1.472404834, 1.243448149, -0.4043259478, -1.378985291])
    spec("D2 g_alpha", alpha.grad, [-0.1769237229, -0.4041672254, -0.12608953])
    spec("D2 g_b[0:4]", b.grad[:4], [0.1889600592, -0.03235762583, 0.2180151484, 0.1347899441])
    spec("D2 checksum(gphi)", checksum(phi.grad.T), 0.9514994468)


def test_e_value_residual():
    v1, vn = leaf(fill(70, (2, 4))), leaf(fill(71, (2, 4)))
    for l1, l2, want in ((0.5, 0.5, [0.3125, 0.375, -0.1875, -0.625, -0.1875, -0.25, -0.0625, 0.0625]),
                         (0.3, 0.7, [0.5875, 0.225, 0.0875, -0.775, 0.0875, -0.4, 0.2125, 0.3375])):
        lam = leaf(torch.tensor([l1, l2]))
        v = R.value_residual(v1, vn, lam[0], lam[1])
        (v * fill(72, (2, 4))).sum().backward()
        spec("E V'", v, want)
        spec("E g_lambda", lam.grad, [-0.125, -0.921875])
    p = leaf(torch.tensor(0.3))
    (R.value_residual(v1, vn, p, 1 - p) * fill(72, (2, 4))).sum().backward()
    spec("E g_lambda (convex)", p.grad, 0.796875)
    assert torch.equal(R.value_residual(v1, vn, 0.0, 1.0), vn)


if __name__ == "__main__":
    sys.exit(run_tests(globals()))
