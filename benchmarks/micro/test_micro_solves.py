"""Solves with a batch of Gram matrices ``A_b = X_bᵀX_b``: Cholesky vs pinv, raw and through ``strategies.inverse``."""

import pytest
import torch
from micro_common import D_E, D_S, anisotropic_inputs

from growbench.strategies.inverse import Pinv, Solve


@pytest.fixture(scope="module", params=[64, 256], ids=lambda b: f"b{b}")
def grams(request):
    X = anisotropic_inputs(request.param, D_S, D_E)
    A = X.mT @ X
    R = torch.randn(A.shape, generator=torch.Generator().manual_seed(2))
    return A, R


def test_cholesky_solve(benchmark, grams):
    A, R = grams
    benchmark.group = f"gram solve b={A.shape[0]}"
    out = benchmark(lambda: torch.cholesky_solve(R, torch.linalg.cholesky(A)))
    assert torch.isfinite(out).all()


def test_pinv_solve(benchmark, grams):
    A, R = grams
    benchmark.group = f"gram solve b={A.shape[0]}"
    out = benchmark(lambda: torch.linalg.pinv(A, hermitian=True) @ R)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("inverse", [Solve, Pinv], ids=["solve", "pinv"])
def test_component_sandwich(benchmark, grams, inverse):
    """``A^{-1} M A^{-1}`` by the project's inverse component (factor once, two solves)."""
    A, M = grams
    inv = inverse()
    benchmark.group = f"strategies.inverse sandwich b={A.shape[0]}"
    out = benchmark(lambda: inv.factor(A, []).sandwich(M))
    assert torch.isfinite(out).all()
