"""Truncation ``T_r`` (docs/mathematics.md §4): Eckart–Young, metric-aware optimality, randomised SVD."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import DT, anisotropic_X, covariance, gen, np64, rel_err

from growbench import strategies

FULL = strategies.REGISTRY["truncation"]["full"]
RSVD = strategies.REGISTRY["truncation"]["rsvd"]


def product(U, s, V) -> torch.Tensor:
    return (U * s) @ V.T


def sqrt_psd(A: np.ndarray) -> np.ndarray:
    w, V = np.linalg.eigh(A)
    return (V * np.sqrt(w)) @ V.T


def low_rank(d: int, rank: int, seed: int) -> torch.Tensor:
    g = gen(seed)
    return torch.randn(d, rank, generator=g, dtype=DT) @ torch.randn(rank, d, generator=g, dtype=DT)


@pytest.mark.parametrize("rank", [1, 3, 5])
def test_full_truncation_is_eckart_young(rank):
    Y = torch.randn(7, 7, generator=gen(rank), dtype=DT)
    U, s, V = FULL()(Y, rank)
    assert U.shape == (7, rank) and s.shape == (rank,) and V.shape == (7, rank)
    sv = np.linalg.svd(np64(Y), compute_uv=False)
    assert np.linalg.norm(np64(Y - product(U, s, V))) ** 2 == pytest.approx((sv[rank:] ** 2).sum(), rel=1e-10)
    assert np.linalg.matrix_rank(np64(product(U, s, V))) == rank


@pytest.mark.parametrize("cond", [1.0, 1e2, 1e4])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_metric_truncation_attains_optimal_functional_error(seed, cond):
    """One sample: ``‖X(Y − Z')Xᵀ‖² = Σ discarded σ²(W Y W)``, ``W = (XᵀX)^{1/2}``; never worse than plain."""
    d_s, d_e = 10, 6
    X = anisotropic_X(1, d_s, d_e, cond=cond, seed=seed)[0]
    Y = torch.randn(d_e, d_e, generator=gen(100 + seed), dtype=DT)
    A = X.T @ X
    metric = strategies.Metric(A)
    Wn = sqrt_psd(np64(A))
    sv = np.linalg.svd(Wn @ np64(Y) @ Wn, compute_uv=False)
    for rank in (1, 2, 4):
        for trunc in (FULL(metric=True), RSVD(metric=True, oversample=d_e)):
            Zm = product(*trunc(Y, rank, metric))
            err_metric = float(((X @ (Y - Zm) @ X.T) ** 2).sum())
            assert err_metric == pytest.approx((sv[rank:] ** 2).sum(), rel=1e-8), (trunc.name, rank)
            Zp = product(*FULL()(Y, rank))
            err_plain = float(((X @ (Y - Zp) @ X.T) ** 2).sum())
            assert err_metric <= err_plain * (1 + 1e-10)
            if cond >= 1e2:
                assert err_metric < 0.99 * err_plain  # anisotropy: plain truncation is visibly worse


def test_metric_from_statistics_is_a_cholesky_factor_of_mean_gram():
    """A regular ``E[A]`` is factorised by Cholesky alone: ``L Lᵀ = E[A]``, ``L`` lower triangular, no fallback."""
    X = anisotropic_X(4, 8, 5, cond=1e3, seed=3)
    stats = strategies.make("formula2").new_statistics().update(X, torch.zeros(4, 8, 8, dtype=DT))
    A = sum(x.T @ x for x in X) / 4
    m = strategies.Metric(stats.mean_A)
    assert m.log == [] and m.null_dims == 0
    assert rel_err(m.L @ m.L.T, A) < 1e-10
    assert torch.equal(m.L, m.L.tril())
    # unwhiten inverts Lᵀ: L^{-T} (Lᵀ U) = U.
    U = torch.randn(5, 2, generator=gen(9), dtype=DT)
    assert rel_err(m.unwhiten(m.L.T @ U), U) < 1e-10
    # The whitened norm is the symmetric square root's: ‖Lᵀ B L‖ = ‖A^{1/2} B A^{1/2}‖.
    B = torch.randn(5, 5, generator=gen(10), dtype=DT)
    Wn = sqrt_psd(np64(A))
    assert float(torch.linalg.matrix_norm(m.whiten(B))) == pytest.approx(np.linalg.norm(Wn @ np64(B) @ Wn), rel=1e-10)


def test_metric_on_singular_gram_keeps_low_rank_matrices():
    """docs/mathematics.md §4.5: the floored factor stays invertible, so ``T^W_r(Z) = Z`` when ``rank Z ≤ r``."""
    X = anisotropic_X(1, 3, 6, seed=4)[0]  # rank 3 < d_e = 6
    metric = strategies.Metric(X.T @ X)
    # Found by inverse iteration, not by the eigendecomposition fallback.
    assert metric.null_dims == 3 and metric.log == []
    assert torch.isfinite(metric.L).all() and float(metric.L.diagonal().abs().min()) > 0
    Z = low_rank(6, 2, seed=5)
    for trunc in (FULL(metric=True), RSVD(metric=True)):
        for rank in (2, 4):
            assert rel_err(product(*trunc(Z, rank, metric)), Z) < 1e-6


@pytest.mark.parametrize("singular", [False, True])
def test_a_metric_from_an_eigendecomposition_is_the_factorised_metric(singular):
    """``Metric.from_eigh`` floors the matrix ``factor_psd`` factorises (``A + δI + f N Nᵀ``): the same ``L Lᵀ``, so
    the same metric-aware truncation (the optimum does not depend on which factor); a direction given in the
    eigenbasis whitens entrywise to ``Lᵀ P L``, a gradient to ``L⁻¹ M L⁻ᵀ`` (``⟨L⁻¹ M L⁻ᵀ, Lᵀ P L⟩ = ⟨M, P⟩``), and
    ``unwhiten`` inverts ``Lᵀ``."""
    d = 7
    X = anisotropic_X(1, 4 if singular else 12, d, cond=1e2, seed=31)[0]
    A = X.T @ X
    chol, eig = strategies.Metric(A), strategies.Metric.from_eigh(*torch.linalg.eigh(A))
    assert eig.log == [] and chol.log == [] and eig.eigenbasis is not None and chol.eigenbasis is None
    assert eig.null_dims == chol.null_dims == (3 if singular else 0)
    assert rel_err(eig.L @ eig.L.T, chol.L @ chol.L.T) < 1e-10
    Y = torch.randn(d, d, generator=gen(32), dtype=DT)
    for rank in (1, 3):
        assert rel_err(product(*FULL(metric=True)(Y, rank, eig)), product(*FULL(metric=True)(Y, rank, chol))) < 1e-8
    V = eig.eigenbasis
    assert rel_err(eig.whiten_rotated(V.T @ Y @ V), eig.whiten(Y)) < 1e-12
    M = torch.randn(d, d, generator=gen(33), dtype=DT)
    N = eig.whiten_gradient_rotated(V.T @ M @ V)
    assert rel_err(N, torch.linalg.solve(eig.L, torch.linalg.solve(eig.L, M).T).T) < 1e-10
    assert float((N * eig.whiten(Y)).sum()) == pytest.approx(float((M * Y).sum()), rel=1e-10)
    U = torch.randn(d, 2, generator=gen(34), dtype=DT)
    assert rel_err(eig.unwhiten(eig.L.T @ U), U) < 1e-10


@pytest.mark.parametrize("metric", [False, True])
@pytest.mark.parametrize("n_iter", [0, 2])
def test_rsvd_equals_full_when_rank_fits_the_sketch(n_iter, metric):
    d, rank = 12, 3
    Y = low_rank(d, 9, seed=6)  # rank 9 ≤ r + oversample = 3 + 8 = 11
    m = strategies.Metric(covariance(d, 1e2, seed=7)) if metric else None
    full = product(*FULL()(Y, rank, m))
    rsvd = product(*RSVD(oversample=8, n_iter=n_iter, seed=1)(Y, rank, m))
    assert rel_err(rsvd, full) < 1e-8
    # Guard: the top-r part is a real truncation, not Y itself.
    assert rel_err(full, Y) > 1e-2


def test_rsvd_same_seed_same_result_and_global_rng_untouched():
    Y = torch.randn(10, 10, generator=gen(8), dtype=DT)  # full rank: the sketch is approximate
    t = RSVD(oversample=2, n_iter=1, seed=5)
    torch.manual_seed(1234)
    state = torch.get_rng_state()
    a = t(Y, 3)
    assert torch.equal(torch.get_rng_state(), state)
    b = t(Y, 3)
    assert torch.equal(torch.get_rng_state(), state)
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    # The caller's stream continues exactly as if nothing had been drawn.
    after = torch.rand(4)
    torch.manual_seed(1234)
    assert torch.equal(after, torch.rand(4))
    # Another seed sketches differently: approximate results differ, so the seed is really used.
    c = RSVD(oversample=2, n_iter=1, seed=6)(Y, 3)
    assert not torch.equal(product(*a), product(*c))


@pytest.mark.parametrize("kind", ["full", "rsvd"])
def test_a_path_whitened_from_zs_factors_and_a_given_direction_is_the_same_path(kind):
    # Z = A Bᵀ whitened through its factors, and P̂ whitened by the caller: no (d, d) whitening on the path, and
    # the same truncated steps as the path that whitens both itself.
    d, rank, k = 9, 3, 2
    A, B = (torch.randn(d, k, generator=gen(seed), dtype=DT) for seed in (21, 22))
    P = torch.randn(d, d, generator=gen(23), dtype=DT)
    m = strategies.Metric(covariance(d, 1e3, seed=24))
    trunc = FULL(metric=True) if kind == "full" else RSVD(metric=True, oversample=d)
    assert rel_err(m.whiten_factors(A, B), m.whiten(A @ B.T)) < 1e-12
    given = trunc.along(A @ B.T, P, rank, m, Z_factors=(A, B), P_whitened=m.whiten(P))
    whiten = m.whiten
    m.whiten = lambda Y: pytest.fail("whitened a (d, d) matrix on a path given its whitened inputs")
    steps = [product(*given(lam)) for lam in (0.0, 0.03, 0.4, 2.5)]
    m.whiten = whiten
    own = trunc.along(A @ B.T, P, rank, m)
    for lam, step in zip((0.0, 0.03, 0.4, 2.5), steps, strict=True):
        assert rel_err(step, product(*own(lam))) < 1e-10, lam


@pytest.mark.parametrize("metric", [False, True])
@pytest.mark.parametrize("kind", ["full", "rsvd"])
def test_truncation_along_a_path_is_the_truncation_of_each_step(kind, metric):
    """``along(Z, P̂)(λ) = T_r(Z − λP̂)`` at every λ (the metric's whitening done once for the path, not per
    step), differentiable in a tensor λ like the per-step route, and whitening twice however many steps."""
    d, rank = 9, 3
    Z, P = low_rank(d, 2, seed=11), torch.randn(d, d, generator=gen(12), dtype=DT)
    m = strategies.Metric(covariance(d, 1e3, seed=13)) if metric else None
    trunc = FULL(metric=metric) if kind == "full" else RSVD(metric=metric, oversample=d)
    whitened = []
    if m is not None:
        whiten = m.whiten
        m.whiten = lambda Y: whitened.append(Y) or whiten(Y)
    path = trunc.along(Z, P, rank, m)
    for lam in (0.0, 0.03, 0.4, 2.5):
        assert rel_err(product(*path(lam)), product(*trunc(Z - lam * P, rank, m))) < 1e-10, lam
    assert len(whitened) == (4 + 2 if metric else 0)  # two for the path, one per per-step call

    def loss_along(route, t):
        return (product(*route(t)) ** 2).sum()

    t = torch.tensor(0.4, dtype=DT, requires_grad=True)
    (g_path,) = torch.autograd.grad(loss_along(path, t), t)
    (g_step,) = torch.autograd.grad(loss_along(lambda lam: trunc(Z - lam * P, rank, m), t), t)
    h = 1e-6
    central = (float(loss_along(path, 0.4 + h)) - float(loss_along(path, 0.4 - h))) / (2 * h)
    assert float(g_path) == pytest.approx(float(g_step), rel=1e-8)
    assert float(g_path) == pytest.approx(central, rel=1e-5)
