"""``strategies.gram.factor_psd``: Cholesky with the null directions removed, against numpy's pinv and null space."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import DT, anisotropic_X, gen, np64, rel_err, repeated_tokens_X

from growbench import strategies
from growbench.strategies.gram import factor_psd


def layernorm_with_ones(n: int, d: int, seed: int, dtype=DT, mix: float = 1.0) -> torch.Tensor:
    """Post-LayerNorm features with an affine (γ, β) and a ones column: exactly one null direction."""
    g = gen(seed)
    mixing = torch.eye(d, dtype=torch.float64) + mix * torch.randn(d, d, generator=g, dtype=torch.float64)
    x = torch.randn(n, d, generator=g, dtype=torch.float64) @ mixing
    gamma = 0.5 + torch.rand(d, generator=g, dtype=torch.float64)
    beta = 0.1 * torch.randn(d, generator=g, dtype=torch.float64)
    y = torch.nn.functional.layer_norm(x, (d,)) * gamma + beta
    return torch.cat([y, torch.ones(n, 1, dtype=torch.float64)], dim=1).to(dtype)


CASES = {
    "layernorm+ones": lambda: layernorm_with_ones(200, 12, seed=1),
    "fewer tokens than features": lambda: anisotropic_X(1, 5, 9, cond=1e2, seed=2)[0],
    "repeated tokens": lambda: repeated_tokens_X(3, 8, 7, vocab=4, seed=3).reshape(-1, 7),
    "regular": lambda: anisotropic_X(1, 40, 8, cond=1e3, seed=4)[0],
}


@pytest.mark.parametrize("case", list(CASES))
def test_null_space_and_pseudo_inverse_match_numpy(case):
    X = CASES[case]()
    A = X.T @ X / X.shape[0]
    An = np64(A)
    rank = np.linalg.matrix_rank(np64(X))
    f = factor_psd(A, rtol=A.shape[0] * torch.finfo(DT).eps)
    assert f is not None
    assert f.n_null == A.shape[0] - rank
    if f.n_null:
        # The basis is orthonormal and spans the inputs' null space: X N = 0.
        assert rel_err(f.null.T @ f.null, torch.eye(f.n_null, dtype=DT)) < 1e-10
        assert float(torch.linalg.matrix_norm(X @ f.null)) < 1e-8 * float(torch.linalg.matrix_norm(X))
    G = torch.randn(X.shape[0], X.shape[0], generator=gen(5), dtype=DT)
    M = X.T @ G @ X  # in the range of A, like E[M]
    ref = np.linalg.pinv(An, rtol=1e-10) @ np64(M) @ np.linalg.pinv(An, rtol=1e-10)
    assert rel_err(f.pinv_sandwich(M), ref) < 1e-8


def test_float32_layernorm_inputs_need_no_eigendecomposition():
    """The real-model case in float32: the one null direction is found, the metric and ``solve`` use Cholesky."""
    X = layernorm_with_ones(512, 48, seed=6, dtype=torch.float32, mix=0.0)
    A = X.T @ X / X.shape[0]
    w = np.linalg.eigvalsh(np64(A)) / np.linalg.norm(np64(A))
    assert w[0] < 1e-6 < 1e-3 < w[1]  # one null direction, the rest well above any cutoff
    m = strategies.Metric(A)
    assert m.log == [] and m.null_dims == 1
    G = torch.randn(1, 512, 512, generator=gen(7)) / 512
    s = strategies.make("gram/solve/full+metric/fast:grid")
    P = s.direction(X.unsqueeze(0), G)
    An = np64(X.T @ X)  # one sample: E[A] = XᵀX
    ref = np.linalg.pinv(An, rtol=1e-6) @ np64(X.T @ G[0] @ X) @ np.linalg.pinv(An, rtol=1e-6)
    assert rel_err(P, ref) < 1e-3
    W_Q = torch.randn(49, 4, generator=gen(8)) * 0.3
    r = s.grow(W_Q, W_Q.clone(), X.unsqueeze(0), G, p=4, loss_of_scores=lambda S: (S ** 2).mean())
    assert r.fallback == [] and r.info["null_directions"] == 1


def test_indefinite_matrix_is_refused_for_the_caller_to_fall_back():
    A = torch.diag(torch.tensor([1.0, 0.5, -0.3], dtype=DT))
    assert factor_psd(A, rtol=1e-12) is None
    m = strategies.Metric(A)
    assert m.log and "eigh" in m.log[0]
