"""Choosing λ (docs/mathematics.md §5): Newton on a quadratic, the grid as documented, fast = normal without a
rank limit."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import DT, Counted, anisotropic_X, attention_loss, causal, factors, gen, grad_of
from torch.overrides import TorchFunctionMode

from growbench import strategies


def quadratic_problem(seed: int, d_k: int, d_e: int = 5, b: int = 3, d_s: int = 7, masked: bool = False):
    """``loss(S) = 0.5 ‖mask ⊙ (S − T)‖²`` at a random point, with ``G`` by autograd."""
    X = anisotropic_X(b, d_s, d_e, cond=1e2, seed=seed)
    W_Q, W_K = factors(d_e, d_k, seed=seed + 1)
    c = 1 / math.sqrt(max(d_k, 1))
    S0 = X @ (c * W_Q @ W_K.T) @ X.mT
    T = torch.randn(b, d_s, d_s, generator=gen(seed + 2), dtype=DT) * 2
    mask = causal(d_s) if masked else None
    m = 1.0 if mask is None else mask.to(DT)

    def loss(S):
        return 0.5 * ((m * (S - T)) ** 2).sum()

    return X, W_Q, W_K, c, S0, T, mask, m, loss, grad_of(loss, S0)


def closed_form_lambda(s, X, G, mask, m, S0, T) -> float:
    """Minimiser of φ(λ) = 0.5‖m ⊙ (S0 − λ D̂ − T)‖² with D̂ = m ⊙ X P Xᵀ / ‖·‖: ⟨m ⊙ (S0 − T), D̂⟩."""
    P = s.direction(X, G, mask)
    D = m * (X @ P @ X.mT)
    D_hat = D / torch.linalg.vector_norm(D)
    return float((m * (S0 - T) * D_hat).sum()), D_hat


NEWTON_SPECS = [
    "gram/pinv/full/fast:newton",
    "gram/solve/full+metric/fast:newton",
    "joint/solve/full/fast:newton",
    "per-sample/pinv/rsvd+metric/fast:newton",
    "mean-input/solve/full/fast:newton",
    "gram/solve/full/normal:newton",  # the rank limit does not bind below (d_k + p = d_e)
]


@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "causal"])
@pytest.mark.parametrize("spec", NEWTON_SPECS)
def test_newton_finds_exact_minimiser_of_quadratic(spec, masked):
    for seed in (0, 10):
        d_e = 5
        d_k = 2
        p = d_e - d_k if "normal" in spec else 2
        X, W_Q, W_K, c, S0, T, mask, m, loss, G = quadratic_problem(seed, d_k, d_e, masked=masked)
        s = strategies.make(spec)
        lam_star, _ = closed_form_lambda(s, X, G, mask, m, S0, T)
        r = s.grow(W_Q, W_K, X, G, p=p, loss_of_scores=loss, scale=c, mask=mask)
        if lam_star > 0:
            assert r.lam == pytest.approx(lam_star, rel=1e-9)
            assert r.info["newton_lambda"] == pytest.approx(lam_star, rel=1e-9)
            assert r.loss_after < r.loss_before
        else:
            assert r.lam == 0.0


QUADRATIC_SPECS = [
    "gram/solve/full+metric/fast:quadratic",
    "joint/solve/full/fast:quadratic",
    "gram/pinv/full/normal:quadratic",
    "per-sample/solve/rsvd/normal:quadratic",
]


@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "causal"])
@pytest.mark.parametrize("spec", QUADRATIC_SPECS)
def test_quadratic_model_is_exact_on_a_quadratic_loss_with_one_trial(spec, masked):
    """φ(0), φ'(0) = −⟨G, D̂⟩ and one trial fix a quadratic exactly: λ is the closed-form minimiser."""
    for seed in (0, 10):
        d_e, d_k = 5, 2
        X, W_Q, W_K, c, S0, T, mask, m, loss, G = quadratic_problem(seed, d_k, d_e, masked=masked)
        s = strategies.make(spec)
        lam_star, D_hat = closed_form_lambda(s, X, G, mask, m, S0, T)
        counted = Counted(loss)
        r = s.grow(W_Q, W_K, X, G, p=d_e - d_k, loss_of_scores=counted, scale=c, mask=mask)
        if lam_star > 0:
            assert r.lam == pytest.approx(lam_star, rel=1e-8)
            assert len(r.info["quadratic_trials"]) == 1
            # loss before, one trial, then the step itself: no AD, no grid.
            assert counted.calls == 3
            assert r.loss_after == pytest.approx(float(loss(S0 - lam_star * D_hat)), rel=1e-8)
        else:
            assert r.lam == 0.0


def test_fast_search_backtracks_when_the_truncated_step_increases_the_loss():
    """With the rank limit binding, the untruncated λ can overshoot; the truncated step must still decrease."""
    X, W_Q, W_K, c, S0, T, mask, m, loss, G = quadratic_problem(3, d_k=2, d_e=6)
    for spec in ("gram/solve/full/fast:quadratic", "gram/solve/full/fast:grid", "joint/solve/full/fast:newton"):
        r = strategies.make(spec).grow(W_Q, W_K, X, G, p=1, loss_of_scores=loss, scale=c)
        Z_new = c * r.W_Q @ r.W_K.T
        with torch.no_grad():
            assert float(loss(X @ Z_new @ X.mT)) == pytest.approx(r.loss_after, rel=1e-9)
        assert r.loss_after <= r.loss_before
        assert r.lam == 0.0 or r.loss_after < r.loss_before


def test_newton_guard_direction_is_a_descent_direction_for_gram():
    """Guard for the test above: with gram/joint ⟨G, X P Xᵀ⟩ ≥ 0, so λ* > 0 is really exercised."""
    for seed in (0, 10):
        X, W_Q, W_K, c, S0, T, mask, m, loss, G = quadratic_problem(seed, 2)
        for spec in ("formula2", "joint"):
            P = strategies.make(spec).direction(X, G)
            assert float((G * (X @ P @ X.mT)).sum()) > 0


def test_grid_search_picks_the_best_documented_grid_point():
    """fast:grid chooses the argmin over {0} ∪ geomspace(1e-3, 10, 16)·sqrt(#entries) of L(S0 − λ D̂)."""
    b, d_s, d_e, d_k, p = 3, 6, 5, 1, 2
    X = anisotropic_X(b, d_s, d_e, cond=1e2, seed=20)
    W_Q, W_K = factors(d_e, d_k, seed=21)
    loss = attention_loss(b, d_s, seed=22)
    S0 = X @ (W_Q @ W_K.T) @ X.mT
    G = grad_of(loss, S0)
    s = strategies.make("gram/pinv/full/fast:grid")
    P = s.direction(X, G)
    D = X @ P @ X.mT
    D_hat = D / torch.linalg.vector_norm(D)
    lams = [0.0] + list(np.geomspace(1e-3, 10.0, 16) * math.sqrt(b * d_s * d_s))
    with torch.no_grad():
        vals = [float(loss(S0 - lam * D_hat)) for lam in lams]
    best = int(np.argmin(vals))
    assert 0 < best < len(lams) - 1  # an interior grid point: the test is not about the ends
    counted = Counted(loss)
    r = s.grow(W_Q, W_K, X, G, p=p, loss_of_scores=counted, scale=1.0)
    assert r.lam == pytest.approx(lams[best], rel=1e-12)
    # loss0 + 16 grid points + the loss at the truncated step
    assert counted.calls == r.n_loss_evals == 18


def test_bounded_search_finds_the_minimiser_of_a_quadratic():
    X, W_Q, W_K, c, S0, T, mask, m, loss, G = quadratic_problem(30, 2)
    s = strategies.make("gram/pinv/full/fast:bounded")
    P = s.direction(X, G)
    D = X @ P @ X.mT
    lam_star = float(((S0 - T) * D).sum() / torch.linalg.vector_norm(D))
    n = math.sqrt(X.shape[0] * X.shape[1] ** 2)
    assert 1e-3 * n < lam_star < 10 * n  # inside the documented bracket
    r = s.grow(W_Q, W_K, X, G, p=2, loss_of_scores=loss, scale=c)
    assert r.lam == pytest.approx(lam_star, rel=5e-3)  # Brent's xatol is 1e-3 on log λ


def test_newton_backtracks_or_falls_back_on_a_nonconvex_loss():
    """On a loss concave along the path, newton records that it used the bounded search; loss never rises (normal)."""
    X, W_Q, W_K, c, S0, T, mask, m, loss, G = quadratic_problem(40, 2)

    def concave(S):
        return -0.5 * ((S - T) ** 2).sum()

    G = grad_of(concave, S0)
    r = strategies.make("gram/pinv/full/normal:newton").grow(W_Q, W_K, X, G, p=1, loss_of_scores=concave, scale=c)
    assert any("bounded" in msg for msg in r.fallback), r.fallback
    assert r.loss_after <= r.loss_before
    assert r.lam > 0


@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "causal"])
@pytest.mark.parametrize("method", ["grid", "bounded", "newton"])
@pytest.mark.parametrize("avg", ["gram/solve", "per-sample/pinv", "joint/solve"])
def test_fast_and_normal_agree_when_rank_limit_does_not_bind(avg, method, masked):
    b, d_s, d_e, d_k = 3, 6, 4, 1
    p = d_e - d_k
    X = anisotropic_X(b, d_s, d_e, cond=1e2, seed=50)
    mask = causal(d_s) if masked else None
    W_Q, W_K = factors(d_e, d_k, seed=51)
    loss = attention_loss(b, d_s, seed=52, mask=mask)
    G = grad_of(loss, X @ (W_Q @ W_K.T) @ X.mT)
    rs = {}
    for path in ("fast", "normal"):
        rs[path] = strategies.make(f"{avg}/full/{path}:{method}").grow(
            W_Q, W_K, X, G, p=p, loss_of_scores=loss, scale=1.0, mask=mask
        )
    f, n = rs["fast"], rs["normal"]
    assert f.lam > 0  # a real step, not two zeros
    assert f.lam == pytest.approx(n.lam, rel=1e-6)
    assert f.loss_after == pytest.approx(n.loss_after, rel=1e-9)
    assert torch.allclose(f.dZ, n.dZ, rtol=1e-6, atol=1e-9 * float(f.dZ.abs().max()))


@pytest.mark.parametrize("method", ["grid", "bounded", "newton"])
def test_normal_search_never_increases_the_loss(method):
    for seed in (60, 61, 62):
        b, d_s, d_e, d_k = 2, 5, 6, 2
        X = anisotropic_X(b, d_s, d_e, cond=1e3, seed=seed)
        W_Q, W_K = factors(d_e, d_k, seed=seed + 1, std=1.5)
        loss = attention_loss(b, d_s, seed=seed + 2)
        G = grad_of(loss, X @ (W_Q @ W_K.T / math.sqrt(d_k)) @ X.mT)
        for avg in ("per-sample/pinv", "mean-input/pinv", "gram/solve"):
            r = strategies.make(f"{avg}/rsvd+metric/normal:{method}").grow(W_Q, W_K, X, G, p=1, loss_of_scores=loss)
            # λ = 0 is always a candidate: no increase beyond the rounding of re-factorising Z.
            assert r.loss_after <= r.loss_before * (1 + 1e-12)


def _fast_problem(seed: int, spec: str, b: int = 4, d_s: int = 12, d_e: int = 8):
    """A softmax-attention loss along the fast path; at d_s = 48 it is far from quadratic."""
    X = anisotropic_X(b, d_s, d_e, cond=10.0, seed=seed)
    W_Q, W_K = factors(d_e, 2, seed=seed + 1)
    loss = Counted(attention_loss(b, d_s, seed=seed + 2))
    c = 1 / math.sqrt(2)
    S0 = X @ (c * W_Q @ W_K.T) @ X.mT
    G = grad_of(loss.fn, S0)
    s = strategies.make(spec)
    stats = s.new_statistics().update(X, G)
    with torch.no_grad():
        ctx = strategies.StepContext(X=X, G=G, mask=None, loss=loss, Z=c * W_Q @ W_K.T, S0=S0,
                                     loss0=float(loss.fn(S0)), scale=c, new_scale=c)
        prob = strategies.build_search_problem(s, stats, ctx, rank=4)
    return s, prob, loss


@pytest.mark.parametrize("size", [(4, 12, 8), (4, 48, 24)])
@pytest.mark.parametrize("seed", range(6))
def test_bracket_reaches_the_dense_scans_best_on_the_fast_path(seed, size):
    """Brute-force reference: 600 log-spaced λ over seven decades. ``bracket`` takes ≥ 98% of the best decrease."""
    s, prob, loss = _fast_problem(seed, "gram/solve/full+metric/fast:bracket", *size)
    log, info = [], {}
    lam, v = s.line_search.search(prob, log, info)
    assert v == pytest.approx(s.line_search.phi(prob, lam), rel=1e-12)  # the reported loss is the loss at λ
    scan = [s.line_search.phi(prob, float(x)) for x in np.geomspace(1e-4, 1e3, 600) * prob.lam_unit]
    best = prob.loss0 - min(scan)
    assert best > 0
    assert prob.loss0 - v >= 0.98 * best, (lam, info, log)
    assert info["bracket_trials"] <= 12


def test_bracket_beats_the_quadratic_model_where_the_path_is_not_quadratic():
    """On the same problems the one-trial quadratic model falls short of the scan's best; bracket does not."""
    shortfalls = []
    for seed in range(6):
        q, prob, _ = _fast_problem(seed, "gram/solve/full+metric/fast:quadratic", 4, 48, 24)
        lam_q, _ = q.line_search.search(prob, [], {})
        scan = [q.line_search.phi(prob, float(x)) for x in np.geomspace(1e-4, 1e3, 600) * prob.lam_unit]
        best = prob.loss0 - min(scan)
        shortfalls.append((prob.loss0 - q.line_search.phi(prob, lam_q)) / best)
    assert min(shortfalls) < 0.95, shortfalls


class HostReads(TorchFunctionMode):
    """Counts every number a computation reads on the host (``item``, ``tolist``, ``float``, ``bool``, ``int`` of a
    tensor): on a GPU, each is a synchronisation. Independent of the growth's own bookkeeping."""

    READS = ("item", "tolist", "__bool__", "__float__", "__int__", "__index__")

    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.n += getattr(func, "__name__", "") in self.READS
        return func(*args, **(kwargs or {}))


HOST_SYNC_SPECS = ["default", "gram/ridge/full+metric/normal+holdout+shrink:bracket",
                   "gram/ridge/rsvd+metric/normal+holdout:bracket", "gram/solve/full+metric/fast:bracket",
                   "gram/solve/rsvd+metric/normal:bracket", "gram/solve/full+metric/normal:newton",
                   "per-sample/solve/full/normal+holdout+shrink:bounded", "gram/ridge/full/normal+shrink+damp:grid",
                   "mean-input/ridge/rsvd/fast:quadratic", "formula1", "formula2", "formula3", "formula4", "joint",
                   "random", "zero", "gradmax"]


@pytest.mark.parametrize("batches", [0, 1, 2])
@pytest.mark.parametrize("spec", HOST_SYNC_SPECS)
def test_host_syncs_count_every_number_the_growth_reads_on_the_host(spec, batches):
    """``info["host_syncs"]`` is exactly the number of host reads an independent torch function mode sees in
    ``grow``: every loss call's value, the decisions of the factorisations, searches and solves (issue 37)."""
    X = anisotropic_X(6, 10, 8, cond=10.0, seed=3)
    W_Q, W_K = factors(8, 2, seed=4)
    loss = attention_loss(6, 10, seed=5)
    G = grad_of(loss, X @ (W_Q @ W_K.T / math.sqrt(2)) @ X.mT)
    s = strategies.make(spec)
    stats = None
    if batches:
        stats = s.new_statistics()
        if batches == 2:
            stats.update(X * 1.1, G)
        stats.update(X, G)
    with HostReads() as reads:
        r = s.grow(W_Q, W_K, X, G, p=2, loss_of_scores=loss, stats=stats)
    assert r.info["host_syncs"] == reads.n, (r.info["host_syncs"], reads.n, r.fallback)
    assert r.info["host_syncs"] >= r.n_loss_evals  # each loss value is read


def _steep_path(m: float, k: int) -> strategies.SearchProblem:
    """A fast path whose loss is ``φ(λ) = 1 − λ/m + (λ/m)^k / k``: minimiser ``λ = m``, known decrease ``1 − 1/k``,
    flat before it and a cliff after it (the shape of the truncated path at d_e = 1024)."""
    def loss(S):
        x = S.sum() / m
        return 1 - x + x**k / k

    z = torch.zeros(1, 1, 1, dtype=torch.float64)
    return strategies.SearchProblem(loss=loss, X=z, Z=z[0], P_hat=z[0], S0=z, D_hat=-torch.ones_like(z), loss0=1.0,
                                    truncate=None, lam_unit=1.0, slope0=-1.0 / m)


@pytest.mark.parametrize("m", [0.07, 0.3, 3.0, 30.0, 300.0])
@pytest.mark.parametrize("k", [2, 4, 8, 16])
def test_bracket_reaches_the_known_minimum_of_a_steep_path(m, k):
    """Known optimum ``λ = m``, up to 300 times beyond the first trial (``λ_1 = 1``): the search reaches 99% of its
    decrease within ``max_trials``, and the reported loss is the loss at the returned λ."""
    prob = _steep_path(m, k)
    info = {}
    search = strategies.line_search.FastSearch("bracket")
    lam, v = search.search(prob, [], info)
    assert v == pytest.approx(float(prob.loss(torch.tensor(lam, dtype=torch.float64))), rel=1e-12)
    assert prob.loss0 - v >= 0.99 * (1 - 1 / k), (lam, info)
    assert info["bracket_trials"] <= search.max_trials


@pytest.mark.parametrize("m", [0.07, 0.3, 3.0, 30.0])
def test_bracket_stops_at_once_on_a_quadratic_path(m):
    """On a quadratic path the model through φ(0), φ'(0) and the first trial is exact: its minimiser is the second
    trial, the model predicted it, and nothing is left to gain (a third trial where the first jump was capped)."""
    prob = _steep_path(m, 2)
    info = {}
    lam, _ = strategies.line_search.FastSearch("bracket").search(prob, [], info)
    assert lam == pytest.approx(m, rel=1e-9)
    assert info["bracket_trials"] == (2 if m <= strategies.line_search.FIRST_JUMP else 3), info


@pytest.mark.parametrize("gain_tol", [0.1, 0.01, 0.001])
def test_a_tighter_gain_tolerance_never_stops_sooner_or_worse(gain_tol):
    """The stopping rule is monotone: a smaller ``gain_tol`` spends at least as many trials for at least the
    decrease, on the softmax paths where the search is far from quadratic."""
    for seed in range(4):
        _, prob, _ = _fast_problem(seed, "gram/solve/full+metric/fast:bracket", 4, 48, 24)
        runs = []
        for tol in (gain_tol, gain_tol / 10):
            info = {}
            _, v = strategies.line_search.FastSearch("bracket", gain_tol=tol).search(prob, [], info)
            runs.append((info["bracket_trials"], prob.loss0 - v))
        assert runs[1][0] >= runs[0][0] and runs[1][1] >= runs[0][1] - 1e-9 * abs(prob.loss0), runs


def test_bracket_options_are_checked():
    with pytest.raises(ValueError, match="max_trials"):
        strategies.line_search.FastSearch("bracket", max_trials=1)
    with pytest.raises(ValueError, match="gain_tol"):
        strategies.line_search.FastSearch("bracket", gain_tol=-0.1)
    with pytest.raises(ValueError, match="trust_tol"):
        strategies.line_search.FastSearch("bracket", trust_tol=1.5)


@pytest.mark.parametrize("seed", range(3))
def test_the_finishing_step_reuses_the_searched_trials_truncation(seed):
    """A normal-path growth takes one SVD per trial and one for the path's slope (the part of ``P̂`` outside ``Z``'s
    spaces): the finishing step at the chosen λ, one of the trials, finds that trial's factors instead of a second
    SVD; and its step is the truncation of ``Z − λP̂`` formed afresh."""
    X, W_Q, W_K, c, S0, T, mask, m, loss, G = quadratic_problem(seed, d_k=2, d_e=6)
    s = strategies.make("gram/solve/full+metric/normal:bracket")
    svds = []
    svd = s.truncation._svd
    s.truncation._svd = lambda Y, rank: svds.append(Y) or svd(Y, rank)
    r = s.grow(W_Q, W_K, X, G, p=2, loss_of_scores=loss, scale=c)
    assert r.lam > 0 and len(svds) == r.info["bracket_trials"] + 1, (len(svds), r.info)
    stats = s.new_statistics().update(X, G)
    ctx, _, _ = strategies.growth.start_step(W_Q, W_K, X, G, loss, c, None, None)
    prob = strategies.build_search_problem(s, stats, ctx, rank=4)
    fresh = s.truncation(prob.Z - r.lam * prob.P_hat, 4, strategies.Metric(stats.mean_A))
    step = (fresh[0] * fresh[1]) @ fresh[2].T
    assert torch.allclose(r.dZ, step - prob.Z, rtol=0, atol=1e-9 * float(prob.Z.abs().max()))


@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "causal"])
@pytest.mark.parametrize("spec", ["gram/solve/full/normal:bracket", "gram/solve/full+metric/normal:bracket",
                                  "gram/ridge/full+metric/normal+shrink:bracket"])
def test_the_normal_path_is_modelled_with_its_own_slope(spec, masked):
    """The slope the normal path's bracket search models the loss with is the searched loss's one-sided slope at
    λ = 0⁺ (finite differences of ``φ`` along the path itself, penalty included), not the fast path's: they differ
    here, because the rank keeps 2 of ``P̂``'s 8 directions outside ``Z``'s spaces."""
    X, W_Q, W_K, c, S0, T, mask, m, loss, G = quadratic_problem(3, d_k=2, d_e=10, b=4, d_s=12, masked=masked)
    s = strategies.make(spec)
    stats = s.new_statistics().update(X, G, mask)
    ctx, _, _ = strategies.growth.start_step(W_Q, W_K, X, G, loss, c, None, mask)
    prob = strategies.build_search_problem(s, stats, ctx, rank=4)
    search = s.line_search
    eps = 1e-6 * prob.lam_unit
    f1, f2 = search.phi(prob, eps), search.phi(prob, 2 * eps)
    finite_difference = 2 * (f1 - prob.loss0) / eps - (f2 - prob.loss0) / (2 * eps)
    assert search.model_slope(prob) == pytest.approx(finite_difference, rel=1e-4)
    assert abs(prob.slope0 - finite_difference) > 0.01 * abs(finite_difference)
