"""Steps judged by data they were not fitted to (docs/mathematics.md §3.5, §5.4): split-half statistics, the ridge
chosen by its honest cosine, the signal share, ``+holdout`` and ``+shrink``.

References are independent of the code under test: statistics accumulated afresh over the batches or samples
meant, a dense ``numpy.linalg.solve`` of the ridge system, the honest cosine by explicit loops, closed forms of the
signal share, and the line search's known optimum on a quadratic path.
"""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
import torch
from conftest import (
    DT,
    Counted,
    anisotropic_X,
    attention_loss,
    causal,
    factors,
    gen,
    grad_of,
    np64,
    random_G,
    rel_err,
    scores,
)

from growbench import strategies
from growbench.harness.capture import statistics_over
from growbench.harness.measure import search_problem
from growbench.strategies.inverse import RIDGE_ALPHAS, Ridge
from growbench.strategies.line_search import NormalSearch, SearchProblem
from growbench.strategies.signal import signal_share
from growbench.strategies.statistics import Statistics


def batches(n: int = 3, b: int = 5, d_s: int = 6, d_e: int = 4, seed: int = 0):
    return [(anisotropic_X(b, d_s, d_e, cond=30, seed=seed + i), random_G(b, d_s, seed=seed + 10 + i))
            for i in range(n)]


# ------------------------------------------------------------------ split-half statistics
@pytest.mark.parametrize("averaging", ["gram", "per-sample", "mean-input", "joint"])
def test_without_last_equals_statistics_of_the_other_batches(averaging):
    data = batches()
    strategy = strategies.make(f"{averaging}/solve/full/normal+shrink:grid")  # +shrink: statistics with half sums
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


@pytest.mark.parametrize("mask_kind", ["none", "causal", "per-sample"])
def test_the_even_half_of_one_batch_is_its_even_samples_statistics(mask_kind):
    # +holdout's split of one batch: Σ A_b and Σ M_b over the samples of even index, and their own split (index
    # 0 mod 4), against sums over the samples one by one; with the same numbers as accumulating them afresh, but for
    # Σ M_b: the whole batch's even-half product, where an update of the half adds its own two halves' products.
    (X, G), = batches(n=1, b=7)
    d_s = X.shape[1]
    mask = {"none": None, "causal": causal(d_s),
            "per-sample": torch.rand(7, d_s, d_s, generator=gen(11), dtype=DT) > 0.3}[mask_kind]
    whole = Statistics().update(X, G, mask)
    half = whole.even_half(X, G, mask)
    assert half.sum_M is whole.sum_M_even
    Gm = np64(G if mask is None else G.masked_fill(~mask, 0.0))
    Xn = np64(X)
    assert rel_err(half.sum_A, sum(x.T @ x for x in Xn[0::2])) < 1e-12
    assert rel_err(half.sum_M, sum(x.T @ g @ x for x, g in zip(Xn[0::2], Gm[0::2], strict=True))) < 1e-12
    assert rel_err(half.sum_M_even, sum(x.T @ g @ x for x, g in zip(Xn[0::4], Gm[0::4], strict=True))) < 1e-12
    assert (half.n, half.tokens, half.n_batches) == (4, 4 * d_s, 1)
    fresh = Statistics().update(X[0::2], G[0::2], mask if mask is None or mask.dim() == 2 else mask[0::2])
    assert all(torch.equal(getattr(half, n), getattr(fresh, n)) for n in ("sum_A", "sum_M_even"))
    assert rel_err(half.sum_M, np64(fresh.sum_M)) < 1e-12
    # Not derivable: two batches, another batch's size, a subclass's extra sums.
    assert Statistics().update(X, G).update(X, G).even_half(X, G) is None
    assert Statistics().update(X[:6], G[:6]).even_half(X, G) is None
    assert strategies.make("formula3").new_statistics().update(X, G).even_half(X, G) is None  # mean-input


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


def test_the_floors_statistics_are_the_two_gram_sums_alone():
    """``split_half=False`` (the floor's statistics, ``statistics_over(None, ...)``) keeps ``Σ A_b`` (the very
    products of the full statistics) and ``Σ M_b`` (one product a batch, where the full statistics add two halves'),
    against sums sample by sample, and no half sums: asking for them is refused in one line, and a one-batch
    ``+holdout`` split falls back to statistics of its own."""
    data = batches(n=3, b=5)
    plain, full = Statistics(split_half=False), Statistics()
    for X, G in data:
        plain.update(X, G)
        full.update(X, G)
    X, G = np64(torch.cat([x for x, _ in data])), np64(torch.cat([g for _, g in data]))
    assert rel_err(plain.sum_A, sum(x.T @ x for x in X)) < 1e-12
    assert rel_err(plain.sum_M, sum(x.T @ g @ x for x, g in zip(X, G, strict=True))) < 1e-12
    assert torch.equal(plain.sum_A, full.sum_A) and rel_err(plain.sum_M, np64(full.sum_M)) < 1e-12
    assert plain.sum_M_even is None and (plain.n, plain.tokens, plain.n_batches) == (full.n, full.tokens, 3)
    with pytest.raises(ValueError, match="split_half=False"):
        plain.half_sums()
    assert rel_err(plain.without_last().sum_M, np64(full.without_last().sum_M)) < 1e-12
    one = Statistics(split_half=False).update(*data[0])
    assert one.even_half(*data[0]) is None
    assert statistics_over(None, [(x, [g], None) for x, g in data]).sum_M_even is None  # (X, G per head, mask)


@pytest.mark.parametrize("spec", ["default", "gram/ridge/rsvd+metric/normal:bracket",
                                  "gram/solve/full/normal+shrink:grid", "gram/pinv/rsvd+metric/normal+shrink:bracket",
                                  "gram/solve/full+metric/fast+holdout:bracket"])
def test_a_growth_refuses_statistics_without_the_half_sums_before_any_work(spec):
    """A strategy whose own statistics keep the half sums (a ridge choosing its strength, ``+shrink``, ``+holdout``),
    handed the floor's, says so in one line before it calls the loss."""
    (X, G), = batches(n=1, b=6, d_s=5, d_e=4)
    W_Q, W_K = factors(4, 2, seed=1)
    loss = Counted(attention_loss(6, 5, seed=2))
    with pytest.raises(ValueError, match="no split-half sums.*new_statistics"):
        strategies.make(spec).grow(W_Q, W_K, X, G, p=1, loss_of_scores=loss,
                                   stats=Statistics(split_half=False).update(X, G))
    assert loss.calls == 0


@pytest.mark.parametrize("spec", ["gram/solve/full+metric/fast:quadratic", "gram/pinv/rsvd/normal:bracket",
                                  "gram/solve/full/normal:grid", "mean-input/solve/full/normal:grid", "formula1",
                                  "joint", "random", "zero"])
def test_a_strategy_that_reads_no_half_sums_keeps_none_and_grows_the_same(spec):
    """The half sums cost a copy of the batch's rows at every update: a strategy that never reads them (no ridge
    choosing its strength, no ``+shrink``, no ``+holdout``) keeps none, and its growth from statistics that hold
    them (``Statistics()``, any strategy's, whose ``Σ M_b`` adds two halves' products) is the growth from its own
    to rounding."""
    s = strategies.make(spec)
    (X, G), = batches(n=1, b=6, d_s=5, d_e=4)
    own = s.new_statistics().update(X, G)
    assert own.sum_M_even is None
    if type(own) is Statistics:
        W_Q, W_K = factors(4, 2, seed=1)
        loss = attention_loss(6, 5, seed=2)
        a = s.grow(W_Q, W_K, X, G, p=1, loss_of_scores=loss, stats=own)
        b = s.grow(W_Q, W_K, X, G, p=1, loss_of_scores=loss, stats=Statistics().update(X, G))
        assert rel_err(a.W_Q, np64(b.W_Q)) < 1e-10 and rel_err(a.W_K, np64(b.W_K)) < 1e-10
        assert a.lam == pytest.approx(b.lam, rel=1e-10)


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


def test_the_share_on_the_subspace_the_truncation_finds():
    # Rank-4 signal with a gap, halves S ± E: the share on the top-4 subspace is 1 − ‖ΠE‖²/‖ΠS‖², Π from the SVD
    # of the halves' sum 2S. rsvd's seeded sketch finds that subspace to rounding; full's is the default path itself.
    from growbench.strategies.truncation import FullSVD, RandomizedSVD

    d, r = 80, 4
    S = 10 * torch.randn(d, r, generator=gen(4), dtype=DT) @ torch.randn(r, d, generator=gen(5), dtype=DT)
    E = torch.randn(d, d, generator=gen(6), dtype=DT)
    halves = (S + E, S - E)
    full = signal_share(halves, halves, rank=r)
    assert signal_share(halves, halves, r, top_subspace=FullSVD().top_subspace) == full
    assert signal_share(halves, halves, r, top_subspace=RandomizedSVD().top_subspace) == pytest.approx(full, rel=1e-9)
    U, _, Vh = torch.linalg.svd(2 * S)
    Pi = (U[:, :r] @ U[:, :r].mT, Vh[:r].mT @ Vh[:r])
    energy = [float(((Pi[0] @ T @ Pi[1]) ** 2).sum()) for T in (E, S)]
    assert full == pytest.approx(1 - energy[0] / energy[1], rel=1e-6)


@pytest.mark.parametrize("cond", [1.0, 30.0, 1e3])
def test_the_share_in_a_metric_is_the_share_of_the_whitened_halves(cond):
    # Brute force: whiten every half with the symmetric square root E[A]^{1/2} (not the metric's Cholesky factor),
    # take the top subspace of the whitened sum by a full SVD, and score the projected halves.
    from growbench.strategies.truncation import Metric

    d, r = 24, 5
    X = anisotropic_X(96, 1, d, cond=cond, seed=11).reshape(96, d)
    A = X.mT @ X / 96
    w, Q = torch.linalg.eigh(A)
    root = Q @ torch.diag(w.sqrt()) @ Q.mT
    S = torch.randn(d, r, generator=gen(12), dtype=DT) @ torch.randn(r, d, generator=gen(13), dtype=DT)
    E = 3 * torch.randn(d, d, generator=gen(14), dtype=DT)
    M_halves, P_halves = (S + E, S - 0.5 * E), (S + 0.5 * E, S - E)
    Y_a, Y_b = (root @ P @ root for P in P_halves)
    N_a, N_b = (torch.linalg.solve(root, torch.linalg.solve(root, M).mT).mT for M in M_halves)
    U, _, Vh = torch.linalg.svd(Y_a + Y_b)
    Pi_U, Pi_V = U[:, :r] @ U[:, :r].mT, Vh[:r].mT @ Vh[:r]

    def proj(T):
        return Pi_U @ T @ Pi_V

    expected = float(2 * ((N_a * proj(Y_b)).sum() + (N_b * proj(Y_a)).sum()) / ((N_a + N_b) * proj(Y_a + Y_b)).sum())
    assert signal_share(M_halves, P_halves, r, Metric(A)) == pytest.approx(expected, rel=1e-9)
    # The caller's whitened direction, in any scale, serves for the top subspace.
    given = 3.0 * Metric(A).whiten(P_halves[0] + P_halves[1])
    assert signal_share(M_halves, P_halves, r, Metric(A), whitened_direction=given) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("cond", [1.0, 1e3])
def test_the_share_from_halves_whitened_in_the_eigenbasis_is_the_share(cond):
    # The ridge's eigenbasis of E[A] whitens halves entrywise (signal_share_whitened): the same share as the
    # Cholesky metric's route through the halves themselves, in any common scale of each pair.
    from growbench.strategies.signal import signal_share_whitened
    from growbench.strategies.truncation import Metric

    d, r = 24, 5
    X = anisotropic_X(96, 1, d, cond=cond, seed=15).reshape(96, d)
    A = X.mT @ X / 96
    S = torch.randn(d, r, generator=gen(16), dtype=DT) @ torch.randn(r, d, generator=gen(17), dtype=DT)
    E = 3 * torch.randn(d, d, generator=gen(18), dtype=DT)
    M_halves, P_halves = (S + E, S - 0.5 * E), (S + 0.5 * E, S - E)
    expected = signal_share(M_halves, P_halves, r, Metric(A))
    eig = Metric.from_eigh(*torch.linalg.eigh(A))
    V = eig.eigenbasis
    N = tuple(eig.whiten_gradient_rotated(2.0 * V.T @ M @ V) for M in M_halves)
    Y = tuple(eig.whiten_rotated(V.T @ P @ V / 3.0) for P in P_halves)
    assert signal_share_whitened(N, Y, r) == pytest.approx(expected, rel=1e-9)
    # Without a metric, the halves rotated into any orthonormal basis: the plain share.
    plain = tuple(tuple(V.T @ T @ V for T in pair) for pair in (M_halves, P_halves))
    assert signal_share_whitened(*plain, r) == pytest.approx(signal_share(M_halves, P_halves, r), rel=1e-9)


@pytest.mark.parametrize("magnitude", [1.0, 2.0**140, 2.0**-140])
def test_the_share_in_float32_is_the_float64_share_at_any_magnitude(magnitude):
    # The estimate runs in the inputs' precision: float32 halves with a metric give the float64 share to float32's
    # rounding, also for gradients beyond float32's range unscaled (2^±140, held in
    # float64 as statistics of an extreme G are).
    from growbench.strategies.truncation import Metric

    d, r = 48, 6
    X = anisotropic_X(64, 1, d, cond=30, seed=7).reshape(64, d)
    S = torch.randn(d, r, generator=gen(8), dtype=DT) @ torch.randn(r, d, generator=gen(9), dtype=DT)
    E = 10 * torch.randn(d, d, generator=gen(10), dtype=DT)
    M_halves, P_halves = (S + E, S - E), (S + 0.5 * E, S - 0.5 * E)
    ref = signal_share(M_halves, P_halves, r, Metric((X.mT @ X) / 64))
    share = signal_share(tuple(magnitude * M for M in M_halves), tuple(P.float() for P in P_halves), r,
                         Metric((X.mT @ X).float() / 64))
    assert 0.2 < ref < 0.95 and share == pytest.approx(ref, abs=1e-5)


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


def _refit_reference(stats, X, G, mask, W_Q, W_K, c, lam):
    """The step ``Z' − Z`` along the direction ``P`` of ``stats`` (every sample's) at ``lam`` RMS logits per attended
    entry of batch ``X`` (``P̂ = P / ‖mask ⊙ X P Xᵀ‖``), truncated as the plain strategy truncates: what
    ``+holdout``'s refit must take."""
    plain = strategies.make("gram/solve/full+metric/normal:bracket")
    prob = search_problem(plain, stats, X, G, mask, W_Q, W_K, c, W_Q.shape[1] + 2, lambda S: torch.zeros(()))
    U, s, V = prob.truncate(prob.Z - lam * _unit_direction(plain.direction(stats), X, mask))
    return (U * s) @ V.T - prob.Z


def _unit_direction(P, X, mask):
    """``P / ‖mask ⊙ X P Xᵀ‖``, the whole batch's norm, in float64."""
    P, X = P.double(), X.double()
    return P / torch.linalg.vector_norm((X @ P @ X.mT) * mask)


def test_holdout_takes_the_lambda_batch_out_of_the_statistics_then_refits():
    data, mask, loss, W_Q, W_K, c = _growth_problem(seed=1)  # a seed whose direction descends on the λ batch
    spec = "gram/solve/full+metric/normal+holdout:bracket"
    X, G = data[-1]

    def statistics(over):
        stats = strategies.make(spec).new_statistics()
        for Xb, Gb in over:
            stats.update(Xb, Gb, mask)
        return stats

    def grow(over):
        return strategies.make(spec).grow(W_Q, W_K, X, G, p=2, loss_of_scores=loss, scale=c, mask=mask,
                                          stats=statistics(over))

    every, others = grow(data), grow(data[:-1])
    # λ is chosen with the other batches' direction on the λ batch: the one a strategy that never saw it finds.
    assert every.lam == pytest.approx(others.lam, rel=1e-9) and every.lam > 0
    assert others.info["holdout"] == "the statistics never saw the λ batch" and "refit" not in others.info
    # The step then takes every batch's direction at that λ.
    assert every.info["refit"] is True and "taken out of the statistics" in every.info["holdout"]
    assert rel_err(every.dZ, np64(_refit_reference(statistics(data), X, G, mask, W_Q, W_K, c, every.lam))) < 1e-9
    assert rel_err(every.dZ, np64(others.dZ)) > 1e-3  # not the held-out direction's step
    with torch.no_grad():
        assert every.loss_after == pytest.approx(float(loss(scores(X, c * every.W_Q @ every.W_K.T))), rel=1e-12)
    # The tokens behind the step's direction: all three batches' (the λ was judged with two).
    assert every.info["statistics_tokens"] == 3 * 6 * 5 and others.info["statistics_tokens"] == 2 * 6 * 5
    with pytest.raises(ValueError, match="batch 1 of the 3"):
        grow([data[-1], *data[:-1]])


def test_holdout_on_one_batch_fits_the_even_samples_searches_the_odd_then_refits():
    data, mask, loss, W_Q, W_K, c = _growth_problem(n=1, b=6, seed=2)  # the even samples' direction descends
    X, G = data[0]
    r = strategies.make("gram/solve/full+metric/normal+holdout:bracket").grow(
        W_Q, W_K, X, G, p=2, loss_of_scores=loss, scale=c, mask=mask)
    assert r.info["statistics_tokens"] == 6 * 5 and "even index" in r.info["holdout"]  # the refit's: every sample
    # The direction searched is the even samples' alone: the same as growing from their statistics.
    even = strategies.make("gram/solve/full+metric/normal:bracket").new_statistics().update(X[0::2], G[0::2], mask)
    assert rel_err(strategies.make("gram/solve/full+metric/normal:bracket").direction(even),
                   np64(strategies.make("gram/solve/full+metric/normal+holdout:bracket").direction(X[0::2], G[0::2],
                                                                                                   mask))) < 1e-14
    # The step is the whole batch's direction at the λ so chosen, and loss_after the whole batch's loss there.
    assert r.lam > 0 and r.info["refit"] is True
    whole = strategies.make("gram/solve/full+metric/normal:bracket").new_statistics().update(X, G, mask)
    assert rel_err(r.dZ, np64(_refit_reference(whole, X, G, mask, W_Q, W_K, c, r.lam))) < 1e-9
    with torch.no_grad():
        assert r.loss_after == pytest.approx(float(loss(scores(X, c * r.W_Q @ r.W_K.T))), rel=1e-12)


def _recorded(loss):
    """A list of every score tensor ``loss`` is called with, and the loss that records them."""
    seen = []

    def recording(S):
        seen.append(S.detach().clone())
        return loss(S)

    return seen, recording


def test_holdout_on_one_batch_searches_lambda_on_the_odd_samples_alone():
    # Every trial of the search moves the odd samples only (the others stay at S0, bit for bit), and the λ the step
    # takes is a trial's: the even samples' direction at λ RMS logits per attended entry of the whole batch.
    data, mask, loss, W_Q, W_K, c = _growth_problem(n=1, b=6, seed=2)
    X, G = data[0]
    seen, recording = _recorded(loss)

    r = strategies.make("gram/solve/full+metric/normal+holdout:bracket").grow(
        W_Q, W_K, X, G, p=2, loss_of_scores=recording, scale=c, mask=mask)
    S0, trials = seen[0], seen[1:-1]  # the current scores' loss first, the whole batch's at the refit step last
    assert r.lam > 0 and r.info["refit"] is True and len(trials) >= 2
    assert all(torch.equal(t[0::2], S0[0::2]) and not torch.equal(t[1::2], S0[1::2]) for t in trials)
    assert not torch.equal(seen[-1][0::2], S0[0::2])  # the refit moves every sample
    plain = strategies.make("gram/solve/full+metric/normal:bracket")
    even = plain.new_statistics().update(X[0::2], G[0::2], mask)
    prob = search_problem(plain, even, X, G, mask, W_Q, W_K, c, W_Q.shape[1] + 2, lambda S: torch.zeros(()))
    U, s, V = prob.truncate(prob.Z - r.lam * _unit_direction(plain.direction(even), X, mask))
    at_lam = scores(X[1::2].double(), (U * s) @ V.T)
    assert min(rel_err(t[1::2], np64(at_lam)) for t in trials) < 1e-9


def test_the_held_out_half_problem_is_differentiable_along_lambda():
    # The Newton search differentiates the loss along λ through the held-out half's scores written among the others':
    # autograd's derivative is the central difference's, and the fitted half stays at S0.
    from growbench.strategies.growth import HELD_OUT_HALF, build_search_problem

    data, mask, loss, W_Q, W_K, c = _growth_problem(n=1, b=6, seed=2)
    X, G = data[0]
    seen, recording = _recorded(loss)

    spec = strategies.make("gram/solve/full+metric/fast+holdout:newton")
    Z = c * W_Q @ W_K.T
    S0 = scores(X, Z)
    ctx = strategies.StepContext(X=X, G=G, mask=mask, loss=recording, Z=Z, S0=S0, loss0=float(loss(S0)), scale=c,
                                 new_scale=c, heldout_samples=HELD_OUT_HALF)
    prob = build_search_problem(spec, spec.new_statistics().update(X[0::2], G[0::2], mask), ctx, 4, penalise=False)
    assert prob.X.shape[0] == prob.S0.shape[0] == prob.D_hat.shape[0] == 3
    for lam in (0.3, 2.0):
        t = torch.tensor(lam, dtype=DT, requires_grad=True)
        (d,) = torch.autograd.grad(prob.loss(prob.S0 - t * prob.D_hat), t)
        h = 1e-5
        fd = (float(prob.loss(prob.S0 - (lam + h) * prob.D_hat)) - float(prob.loss(prob.S0 - (lam - h) * prob.D_hat)))
        assert float(d) == pytest.approx(fd / (2 * h), rel=1e-6)
    assert all(torch.equal(S[0::2], S0[0::2]) and not torch.equal(S[1::2], S0[1::2]) for S in seen)


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


@pytest.mark.parametrize("spec", ["gram/ridge/full+metric/normal+shrink:bracket",
                                  "gram/ridge/full/normal+shrink:bracket"])
def test_a_ridges_share_in_its_eigenbasis_is_the_share_of_its_halves(spec):
    # The ridge keeps its direction and halves in E[A]'s eigenbasis, and the growth whitens them there (the metric
    # from the ridge's eigh): the share it records is the one signal_share gives for the halves made by two solves
    # at the strength it chose, with a metric factorised afresh (or none).
    from growbench.strategies.truncation import Metric

    data, mask, loss, W_Q, W_K, c = _growth_problem(d_e=6, n=2, b=8)
    s = strategies.make(spec)
    stats = s.new_statistics()
    for X, G in data[:2]:
        stats.update(X, G, mask)
    X, G = data[1]
    r = s.grow(W_Q, W_K, X, G, p=2, loss_of_scores=loss, scale=c, mask=mask, stats=stats)
    A = stats.mean_A
    lifted = A + r.info["ridge_alpha"] * float(torch.trace(A) / A.shape[0]) * torch.eye(A.shape[0], dtype=DT)

    def sandwich(M):
        return torch.linalg.solve(lifted, torch.linalg.solve(lifted, M).mT).mT

    M_halves = stats.half_sums()
    P_halves = tuple(sandwich(M / stats.n) for M in M_halves)
    expected = signal_share(M_halves, P_halves, 2 + 2, Metric(A) if "metric" in spec else None)
    assert r.info["signal_share"] == pytest.approx(expected, rel=1e-8)


def test_shrink_without_halves_says_so():
    data, mask, loss, W_Q, W_K, c = _growth_problem(n=1)
    X, G = data[0]
    r = strategies.make("joint/solve/full/normal+shrink:bracket").grow(W_Q, W_K, X, G, p=2, loss_of_scores=loss,
                                                                      scale=c, mask=mask)
    assert any("cannot split its direction" in f for f in r.fallback) and "signal_share" not in r.info


# ------------------------------------------------------------------ +damp
def _path_problem(phi, slope0: float = math.nan) -> SearchProblem:
    """A search problem whose scores along the path are λ itself, so that the loss along it is ``phi(λ)``."""
    one = torch.ones(1, 1, dtype=DT)
    return SearchProblem(loss=lambda S: phi(S.reshape(())), X=torch.ones(1, 1, 1, dtype=DT),
                         Z=torch.zeros(1, 1, dtype=DT), P_hat=one, S0=torch.zeros(1, 1, 1, dtype=DT),
                         D_hat=torch.ones(1, 1, 1, dtype=DT), loss0=float(phi(torch.tensor(0.0, dtype=DT))),
                         truncate=lambda Y: (one, -Y.reshape(1), one), lam_unit=1.0, slope0=slope0)


@pytest.mark.parametrize("damping", [0.25, 0.5, 1.0])
def test_damp_takes_its_share_of_the_known_optimum_and_reports_the_loss_there(damping):
    g_, h = 0.4, 0.1  # φ(λ) = 1 − gλ + hλ²/2: its minimum at g/h = 4

    def phi(lam):
        return 1 - g_ * lam + h * lam**2 / 2

    info: dict = {}
    lam, value = NormalSearch(method="bracket", damp=True, damping=damping).search(_path_problem(phi, -g_), [], info)
    assert info["lam_undamped"] == pytest.approx(g_ / h, rel=1e-3)
    assert lam == pytest.approx(damping * info["lam_undamped"], rel=1e-12)
    assert value == pytest.approx(float(phi(torch.tensor(lam, dtype=DT))), rel=1e-12)
    # On a quadratic path a share s of the best step keeps s(2 − s) of its decrease.
    assert (1 - value) / (g_**2 / (2 * h)) == pytest.approx(damping * (2 - damping), rel=1e-5)


def test_damp_takes_no_step_where_the_damped_step_raises_the_loss():
    # A bump at λ = 2 and a well at λ = 4: the grid's best lies past the bump, half of it on the bump.
    def phi(lam):
        return 1 + 0.5 * torch.exp(-4 * (lam - 1.5) ** 2) - 2 * torch.exp(-4 * (lam - 2.93) ** 2)

    log: list[str] = []
    search = NormalSearch(method="grid", damp=True)
    prob = _path_problem(phi)
    lam, value = search.search(prob, log, {})
    assert NormalSearch(method="grid").search(prob, [], {})[0] == pytest.approx(2.93, rel=0.01)
    assert lam == 0.0 and value == prob.loss0 and any(line.startswith("damp:") for line in log)


@pytest.mark.parametrize("path", ["normal:bracket", "fast:quadratic"])
def test_damped_growth_steps_its_share_of_the_undamped_lambda(path):
    data, mask, loss, W_Q, W_K, c = _growth_problem(n=1, b=6, seed=1)
    X, G = data[0]
    spec = f"gram/solve/full+metric/{path}"
    plain = strategies.make(spec).grow(W_Q, W_K, X, G, p=2, loss_of_scores=loss, scale=c, mask=mask)
    damped_spec = spec.replace(":", "+damp:")
    damped = strategies.make(damped_spec, line_search={"damping": 0.3}).grow(W_Q, W_K, X, G, p=2,
                                                                           loss_of_scores=loss, scale=c, mask=mask)
    assert plain.lam > 0 and damped.spec == damped_spec
    assert damped.info["lam_undamped"] == pytest.approx(plain.lam, rel=1e-9)
    assert damped.lam == pytest.approx(0.3 * plain.lam, rel=1e-9)
    with torch.no_grad():  # the reported loss is the loss at the new factors, and lower than before
        assert damped.loss_after == pytest.approx(float(loss(scores(X, c * damped.W_Q @ damped.W_K.T))), rel=1e-9)
    assert damped.loss_after < damped.loss_before
    unit = strategies.make(damped_spec, line_search={"damping": 1.0}).grow(W_Q, W_K, X, G, p=2,
                                                                          loss_of_scores=loss, scale=c, mask=mask)
    assert unit.lam == plain.lam and torch.equal(unit.dZ, plain.dZ)


@pytest.mark.parametrize("damping", [0.0, 1.5, -0.5, math.nan, True, "0.5"])
def test_damping_out_of_range_is_refused(damping):
    with pytest.raises(ValueError, match="damping must be a number in"):
        strategies.make("gram/solve/full/normal+damp:bracket", line_search={"damping": damping})


def test_damping_without_damp_is_refused():
    with pytest.raises(ValueError, match=r"\+damp"):
        strategies.make("gram/solve/full/normal:bracket", line_search={"damping": 0.5})


def test_the_even_half_from_the_kept_rows_equals_the_one_made_afresh():
    """One-batch statistics keep the even samples' rows of X and G X their ``Σ M_even`` took, and the even half
    made from them is bit for bit the one made from the batch; the rows go with a second batch and a pickle."""
    (X, G), = batches(n=1, b=9)
    mask = causal(X.shape[1])
    assert Statistics().update(X, G, mask)._even_rows is None  # kept for +holdout strategies only
    assert strategies.make("default").new_statistics().keep_one_batch
    stats = Statistics(keep_one_batch=True).update(X, G, mask)
    assert stats._even_rows is not None
    kept = stats.even_half(X, G, mask)
    unpickled = pickle.loads(pickle.dumps(stats))
    assert unpickled._even_rows is None
    afresh = unpickled.even_half(X, G, mask)
    assert all(torch.equal(getattr(kept, n), getattr(afresh, n)) for n in ("sum_A", "sum_M", "sum_M_even"))
    assert stats.update(X, G, mask)._even_rows is None


def test_one_batch_statistics_keep_each_samples_gram_matrix_where_it_pays():
    # keep_one_batch on an unmasked batch with 2 d_e² ≤ d_s²: Σ A_b is the sum of the kept X_bᵀ X_b (against
    # the samples one by one), and the even half sums the kept ones as update() on the half would.
    (X, G), = batches(n=1, b=9)
    d_s, d_e = X.shape[1:]
    assert 2 * d_e * d_e <= d_s * d_s
    stats = Statistics(keep_one_batch=True).update(X, G)
    assert torch.equal(stats.sample_grams, X.mT @ X)
    assert rel_err(stats.sum_A, sum(x.T @ x for x in np64(X))) < 1e-12
    half = stats.even_half(X, G)
    fresh = Statistics(keep_one_batch=True).update(X[0::2], G[0::2])
    assert all(torch.equal(getattr(half, n), getattr(fresh, n)) for n in ("sum_A", "sum_M_even"))
    assert rel_err(half.sum_M, np64(fresh.sum_M)) < 1e-12
    afresh = pickle.loads(pickle.dumps(stats))  # neither rows nor Gram matrices travel
    assert afresh.sample_grams is None and afresh._even_rows is None
    assert all(torch.equal(getattr(afresh.even_half(X, G), n), getattr(half, n)) for n in ("sum_A", "sum_M_even"))
    # Not kept: without the flag, for a masked batch (no Gram matrix leaves masked entries out), for a batch too
    # wide for them to pay, and once a second batch comes.
    assert Statistics().update(X, G).sample_grams is None
    assert Statistics(keep_one_batch=True).update(X, G, causal(d_s)).sample_grams is None
    wide = torch.randn(3, 4, d_e, generator=gen(2), dtype=DT)
    assert Statistics(keep_one_batch=True).update(wide, torch.zeros(3, 4, 4, dtype=DT)).sample_grams is None
    assert stats.update(X, G).sample_grams is None
