"""Steps judged by data they were not fitted to (docs/mathematics.md §3.5, §5.4): split-half statistics, the ridge
chosen by its honest cosine, the signal share, ``+holdout`` and ``+shrink``.

References are independent of the code under test: statistics accumulated afresh over the batches or samples
meant, a dense ``numpy.linalg.solve`` of the ridge system, the honest cosine by explicit loops, closed forms of the
signal share, and the line search's known optimum on a quadratic path.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import DT, anisotropic_X, attention_loss, causal, factors, gen, grad_of, np64, random_G, rel_err, scores

import strategies
from strategies.inverse import RIDGE_ALPHAS, Ridge
from strategies.line_search import NormalSearch, SearchProblem
from strategies.signal import signal_share
from strategies.statistics import Statistics


def batches(n: int = 3, b: int = 5, d_s: int = 6, d_e: int = 4, seed: int = 0):
    return [(anisotropic_X(b, d_s, d_e, cond=30, seed=seed + i), random_G(b, d_s, seed=seed + 10 + i))
            for i in range(n)]


# ------------------------------------------------------------------ split-half statistics
@pytest.mark.parametrize("averaging", ["gram", "per-sample", "mean-input", "joint"])
def test_without_last_equals_statistics_of_the_other_batches(averaging):
    data = batches()
    strategy = strategies.make(f"{averaging}/solve/full/normal:grid")
    whole = strategy.new_statistics()
    for X, G in data:
        whole.update(X, G)
    fresh = strategy.new_statistics()
    for X, G in data[:-1]:
        fresh.update(X, G)
    cut = whole.without_last()
    assert (cut.n, cut.tokens, cut.n_batches) == (fresh.n, fresh.tokens, 2)
    assert rel_err(strategy.direction(cut), np64(strategy.direction(fresh))) < 1e-12
    assert rel_err(cut.half_sums()[0], np64(fresh.half_sums()[0])) < 1e-12
    with pytest.raises(ValueError, match="at least two batches"):
        cut.without_last().without_last()


def test_half_sums_are_the_even_and_odd_samples_across_batches():
    data = batches(n=3, b=5)  # odd batch size: the parity of a batch's first sample alternates
    stats = Statistics()
    for X, G in data:
        stats.update(X, G)
    X = torch.cat([x for x, _ in data])
    G = torch.cat([g for _, g in data])
    even, odd = np64(X)[0::2], np64(X)[1::2]
    Gn = np64(G)
    ref_even = sum(x.T @ g @ x for x, g in zip(even, Gn[0::2], strict=True))
    ref_odd = sum(x.T @ g @ x for x, g in zip(odd, Gn[1::2], strict=True))
    M_even, M_odd = stats.half_sums()
    assert rel_err(M_even, ref_even) < 1e-12 and rel_err(M_odd, ref_odd) < 1e-12
    assert stats.tokens == 15 * 6


def test_batch_index_finds_a_batch_by_its_content():
    data = batches()
    stats = Statistics()
    for X, G in data:
        stats.update(X, G)
    assert [stats.batch_index(X) for X, _ in data] == [0, 1, 2]
    # The same numbers rounded to float32 are the same batch; another draw, or a shift of 1e-3, is not.
    assert stats.batch_index(data[1][0].float()) == 1
    assert stats.batch_index(data[0][0] + 1e-3) is None and stats.batch_index(data[0][0][:2]) is None
    assert stats.batch_index(anisotropic_X(5, 6, 4, cond=30, seed=99)) is None


# ------------------------------------------------------------------ ridge
@pytest.mark.parametrize("alpha", [0.1, 3.0])
def test_ridge_with_a_fixed_strength_solves_the_shifted_system(alpha):
    X, G = batches(n=1, b=8, d_s=5, d_e=6)[0]
    P = strategies.make("gram/ridge/full/normal:grid", inverse={"alpha": alpha}).direction(X, G)
    A = sum(x.T @ x for x in np64(X)) / 8
    M = sum(x.T @ g @ x for x, g in zip(np64(X), np64(G), strict=True)) / 8
    shifted = A + alpha * np.trace(A) / 6 * np.eye(6)
    ref = np.linalg.solve(shifted, np.linalg.solve(shifted, M).T).T
    assert rel_err(P, ref) < 1e-10


def _honest_cosine(A: np.ndarray, Ma: np.ndarray, Mb: np.ndarray, alpha: float) -> float:
    """The criterion of strategies.inverse.Ridge, written out with dense solves (no eigenbasis)."""
    d = A.shape[0]
    R = A + alpha * np.trace(A) / d * np.eye(d)
    Pa, Pb = (np.linalg.solve(R, np.linalg.solve(R, M).T).T for M in (Ma, Mb))
    honest = 2 * (np.sum(Ma * Pb) + np.sum(Mb * Pa))
    w, V = np.linalg.eigh(A)
    P = V.T @ (Pa + Pb) @ V
    return honest / math.sqrt(np.sum(np.outer(w, w) * P**2))


def test_ridge_chooses_the_strength_with_the_highest_honest_cosine():
    # A few tokens in many dimensions: E[A] is ill-conditioned and the halves of M disagree in its weak directions.
    g = gen(3)
    X = anisotropic_X(12, 4, 10, cond=1e4, seed=5)
    signal = torch.randn(10, 10, generator=g, dtype=DT)
    G = random_G(12, 4, seed=6) + 0.5 * (X @ signal @ X.mT)
    stats = strategies.make("gram/ridge/full/normal:grid").new_statistics().update(X, G)
    info: dict = {}
    strategies.make("gram/ridge/full/normal:grid").averaging.direction(stats, [], info)
    A = np64(stats.mean_A)
    Ma, Mb = (np64(M) for M in stats.half_sums())
    cosines = {a: _honest_cosine(A, Ma, Mb, a) for a in RIDGE_ALPHAS if a > 0}
    assert info["ridge_alpha"] == max(cosines, key=cosines.get)
    assert info["ridge_cosine"] == pytest.approx(cosines[info["ridge_alpha"]], rel=1e-6)


def test_ridge_auto_without_halves_takes_the_fallback_strength_and_says_so():
    A = torch.eye(3, dtype=DT) * 2.0
    log: list[str] = []
    factor = Ridge().factor(A, log)
    assert factor.alpha == 1.0 and "no split-half statistics" in log[0]
    assert rel_err(factor.solve(torch.eye(3, dtype=DT)), np.eye(3) / 4.0) < 1e-14  # (2 + 1·2)⁻¹
    with pytest.raises(ValueError, match="alpha"):
        Ridge(alpha=-1.0)


# ------------------------------------------------------------------ signal share
def test_identical_halves_are_all_signal():
    M = torch.randn(5, 5, generator=gen(1), dtype=DT)
    assert signal_share((M, M), (M, M), rank=5) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("noise", [0.0, 0.3, 1.0, 2.0])
def test_signal_share_is_one_minus_the_noise_to_signal_energy(noise):
    # Halves S + E and S − E with an identity metric and the whole rank: 4⟨S+E, S−E⟩ / ‖2S‖² = 1 − ‖E‖²/‖S‖².
    S = torch.randn(6, 6, generator=gen(2), dtype=DT)
    E = noise * torch.randn(6, 6, generator=gen(3), dtype=DT)
    share = signal_share((S + E, S - E), (S + E, S - E), rank=6)
    assert share == pytest.approx(1 - float((E**2).sum() / (S**2).sum()), rel=1e-10)


# ------------------------------------------------------------------ +holdout
def _growth_problem(d_e: int = 5, n: int = 3, b: int = 6, d_s: int = 5, seed: int = 0):
    mask = causal(d_s)
    loss = attention_loss(b, d_s, seed=seed, mask=mask)
    W_Q, W_K = factors(d_e, 2, seed=seed)
    c = 1 / math.sqrt(2)
    data = []
    for i in range(n):
        X = anisotropic_X(b, d_s, d_e, cond=10, seed=seed + i)
        data.append((X, grad_of(loss, scores(X, c * W_Q @ W_K.T))))
    return data, mask, loss, W_Q, W_K, c


def test_holdout_takes_the_lambda_batch_out_of_the_statistics():
    data, mask, loss, W_Q, W_K, c = _growth_problem(seed=1)  # a seed whose direction descends on the λ batch
    spec = "gram/solve/full+metric/normal+holdout:bracket"
    X, G = data[-1]

    def grow(stats_over):
        strategy = strategies.make(spec)
        stats = strategy.new_statistics()
        for Xb, Gb in stats_over:
            stats.update(Xb, Gb, mask)
        return strategy.grow(W_Q, W_K, X, G, p=2, loss_of_scores=loss, scale=c, mask=mask, stats=stats)

    every, others = grow(data), grow(data[:-1])
    # The same step: the sums minus the last batch's contribution equal the other batches' sums up to rounding.
    assert rel_err(every.dZ, np64(others.dZ)) < 1e-9 and every.lam == pytest.approx(others.lam, rel=1e-9)
    assert every.lam > 0
    assert every.info["holdout"] == "the λ batch taken out of the statistics"
    assert others.info["holdout"] == "the statistics never saw the λ batch"
    assert every.info["statistics_tokens"] == 2 * 6 * 5
    with pytest.raises(ValueError, match="batch 1 of the 3"):
        grow([data[-1], *data[:-1]])


def test_holdout_on_one_batch_fits_the_even_samples_and_searches_the_odd():
    data, mask, loss, W_Q, W_K, c = _growth_problem(n=1, b=6)
    X, G = data[0]
    r = strategies.make("gram/solve/full+metric/normal+holdout:bracket").grow(
        W_Q, W_K, X, G, p=2, loss_of_scores=loss, scale=c, mask=mask)
    assert r.info["statistics_tokens"] == 3 * 5 and "even index" in r.info["holdout"]
    # The direction is the even samples' alone: the same as growing from their statistics.
    even = strategies.make("gram/solve/full+metric/normal:bracket").new_statistics().update(X[0::2], G[0::2], mask)
    assert rel_err(strategies.make("gram/solve/full+metric/normal:bracket").direction(even),
                   np64(strategies.make("gram/solve/full+metric/normal+holdout:bracket").direction(X[0::2], G[0::2],
                                                                                                   mask))) < 1e-14
    # loss_after is the whole batch's loss at the new factors.
    with torch.no_grad():
        assert r.loss_after == pytest.approx(float(loss(scores(X, c * r.W_Q @ r.W_K.T))), rel=1e-12)


# ------------------------------------------------------------------ +shrink
def test_the_penalised_search_finds_the_known_optimum_and_reports_the_plain_loss():
    # φ(λ) = 1 − gλ + hλ²/2 along a path whose scores are λ times a fixed direction; with penalty κ the searched
    # objective φ + κλ has its minimum at (g − κ)/h.
    g_, h, kappa = 0.4, 0.1, 0.15
    D = torch.ones(1, 1, 1, dtype=DT)

    def loss(S):  # the scores along the path are λ itself (truncate returns s = −(Z − λP̂) = λ)
        lam = S.reshape(())
        return 1 - g_ * lam + h * lam**2 / 2

    prob = SearchProblem(loss=loss, X=torch.ones(1, 1, 1, dtype=DT), Z=torch.zeros(1, 1, dtype=DT),
                         P_hat=torch.ones(1, 1, dtype=DT), S0=torch.zeros(1, 1, 1, dtype=DT), D_hat=D, loss0=1.0,
                         truncate=lambda Y: (torch.ones(1, 1, dtype=DT), -Y.reshape(1), torch.ones(1, 1, dtype=DT)),
                         lam_unit=1.0, slope0=-g_ + kappa, penalty=kappa)
    lam, value = NormalSearch(method="bracket", shrink=True).search(prob, [], {})
    assert lam == pytest.approx((g_ - kappa) / h, rel=1e-3)
    assert value == pytest.approx(float(loss(lam * D)), rel=1e-12)  # the loss itself, without κλ


def test_shrink_with_all_signal_takes_the_plain_step():
    # Every sample alike: the halves agree exactly, the signal share is 1 and the penalty 0.
    data, mask, loss, W_Q, W_K, c = _growth_problem(n=1, b=2)
    X, G = data[0]
    X, G = torch.cat([X[:1], X[:1]]), torch.cat([G[:1], G[:1]])
    plain = strategies.make("gram/solve/full+metric/normal:bracket").grow(W_Q, W_K, X, G, p=2, loss_of_scores=loss,
                                                                         scale=c, mask=mask)
    shrunk = strategies.make("gram/solve/full+metric/normal+shrink:bracket").grow(W_Q, W_K, X, G, p=2,
                                                                                 loss_of_scores=loss, scale=c,
                                                                                 mask=mask)
    assert shrunk.info["signal_share"] == pytest.approx(1.0, abs=1e-9) and shrunk.info["optimism_penalty"] < 1e-12
    assert shrunk.lam == pytest.approx(plain.lam, rel=1e-9)


def test_shrink_without_halves_says_so():
    data, mask, loss, W_Q, W_K, c = _growth_problem(n=1)
    X, G = data[0]
    r = strategies.make("joint/solve/full/normal+shrink:bracket").grow(W_Q, W_K, X, G, p=2, loss_of_scores=loss,
                                                                      scale=c, mask=mask)
    assert any("cannot split its direction" in f for f in r.fallback) and "signal_share" not in r.info
