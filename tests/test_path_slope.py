"""The truncated path's slope at λ = 0⁺ (strategies/path_slope.py, docs/mathematics.md §5.1) against finite
differences of the truncation itself, formed by brute force in float64."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from growbench import strategies
from growbench.strategies.path_slope import truncated_path_slope

FULL = strategies.REGISTRY["truncation"]["full"]


def _problem(seed: int, d: int = 12, d_k: int = 3, zero_columns: int = 0):
    """``Z = A Bᵀ`` (the last ``zero_columns`` columns of ``A`` zero: rank ``d_k − zero_columns``), a direction of
    full rank, a gradient sum ``M`` and an SPD ``E[A]``, in float64."""
    g = torch.Generator().manual_seed(seed)
    A, B = torch.randn(d, d_k, generator=g, dtype=torch.float64), torch.randn(d, d_k, generator=g, dtype=torch.float64)
    if zero_columns:
        A[:, d_k - zero_columns:] = 0
    P = torch.randn(d, d, generator=g, dtype=torch.float64)
    M = torch.randn(d, d, generator=g, dtype=torch.float64)
    F = torch.randn(4 * d, d, generator=g, dtype=torch.float64) * torch.linspace(0.2, 3.0, d, dtype=torch.float64)
    return A, B, P, M, F.T @ F / (4 * d)


def _truncated(Y: np.ndarray, rank: int, chol: np.ndarray | None) -> np.ndarray:
    """``T_r(Y)``, or ``L^{-T} T_r(Lᵀ Y L) L^{-1}`` for a Cholesky factor ``L``: numpy's full SVD."""
    W = Y if chol is None else chol.T @ Y @ chol
    U, s, Vt = np.linalg.svd(W)
    T = (U[:, :rank] * s[:rank]) @ Vt[:rank]
    if chol is None:
        return T
    inv = np.linalg.inv(chol)  # a reference, not the code under test: an explicit inverse is plain here
    return inv.T @ T @ inv


def _finite_difference(A, B, P, M, rank, chol, eps=1e-7) -> float:
    """``(⟨M, T(Z − εP)⟩ − ⟨M, T(Z)⟩) / ε`` with a second step to cancel the O(ε) term (Richardson)."""
    Z, P, M = (A @ B.T).numpy(), P.numpy(), M.numpy()

    def f(lam: float) -> float:
        return float(np.sum(M * _truncated(Z - lam * P, rank, chol)))

    f0 = f(0.0)
    return 2 * (f(eps) - f0) / eps - (f(2 * eps) - f0) / (2 * eps)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("metric_kind", [None, "cholesky", "eigh"])
@pytest.mark.parametrize("zero_columns", [0, 1])
def test_the_slope_is_the_derivative_of_the_truncated_path(seed, metric_kind, zero_columns):
    """Against finite differences of the brute-force truncation, with and without the metric (either factor), and
    where ``Z`` has fewer directions than factor columns (a growth that appended zero columns)."""
    A, B, P, M, EA = _problem(seed, zero_columns=zero_columns)
    rank = A.shape[1] + 2
    metric = None if metric_kind is None else (strategies.Metric(EA, rtol=1e-12) if metric_kind == "cholesky"
                                               else strategies.Metric.from_eigh(*torch.linalg.eigh(EA), rtol=1e-12))
    chol = None if metric is None else torch.linalg.cholesky(metric.L @ metric.L.T).numpy()
    got = float(truncated_path_slope(M, P, (A, B), rank, FULL(), metric))
    want = _finite_difference(A, B, P, M, rank, chol)
    assert got == pytest.approx(want, rel=1e-5, abs=1e-8 * float(M.abs().max() * P.abs().max()))
    untruncated = -float((M * P).sum())
    assert abs(got - untruncated) > 1e-3 * abs(untruncated)  # P has full rank: the truncation drops some of it


def test_the_slope_is_the_untruncated_one_where_the_rank_keeps_all_of_the_direction():
    """Where ``P``'s part outside ``Z``'s spaces has rank ≤ r − k, the truncation keeps all of it to first order:
    the slope is ``−⟨M, P⟩``."""
    A, B, _, M, _ = _problem(0)
    g = torch.Generator().manual_seed(9)
    P = torch.randn(12, 2, generator=g, dtype=torch.float64) @ torch.randn(2, 12, generator=g, dtype=torch.float64)
    got = float(truncated_path_slope(M, P, (A, B), A.shape[1] + 2, FULL()))
    assert got == pytest.approx(-float((M * P).sum()), rel=1e-10)


def test_from_zero_the_slope_is_that_of_the_directions_top_part():
    """``Z = 0``: ``T_r(−λP) = −λ T_r(P)``, so the slope is ``−⟨M, T_r(P)⟩`` exactly."""
    A, B, P, M, _ = _problem(1)
    U, s, Vh = torch.linalg.svd(P)
    want = -float((M * ((U[:, :4] * s[:4]) @ Vh[:4])).sum())
    got = float(truncated_path_slope(M, P, (torch.zeros_like(A), B), 4, FULL()))
    assert got == pytest.approx(want, rel=1e-10)
