"""The joint direction (PCG) against a dense Kronecker solve of the normal equations (docs/mathematics.md §2–3)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import (
    DT,
    anisotropic_X,
    causal,
    dense_joint,
    factors,
    gen,
    kron_normal,
    masked_scores_np,
    np64,
    random_G,
    rel_err,
)

from growbench import strategies


def joint(**opts):
    return strategies.make("joint/solve/full/fast:grid", averaging={"tol": 1e-10, "maxiter": 500, **opts})


CASES = {
    # name: (b, d_s, d_e, cond)
    "regular": (5, 8, 4, 1e2),
    "anisotropic": (6, 9, 5, 1e3),
    "short": (3, 3, 5, 10.0),  # d_s < d_e: every A_b is singular, the system too
    "one-sample-short": (1, 4, 6, 10.0),
}


@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "causal"])
@pytest.mark.parametrize("case", list(CASES))
def test_joint_equals_dense_kronecker_solve(case, masked):
    b, d_s, d_e, cond = CASES[case]
    X = anisotropic_X(b, d_s, d_e, cond=cond, seed=1)
    mask = causal(d_s) if masked else None
    G = random_G(b, d_s, seed=2, mask=mask)
    P = joint().direction(X, G, mask)
    K, _ = kron_normal(X, G, mask)
    P_ref = dense_joint(X, G, mask)
    # X_b P X_bᵀ (on the mask) is unique even where P is not.
    dS, dS_ref = masked_scores_np(X, np64(P), mask), masked_scores_np(X, P_ref, mask)
    assert np.linalg.norm(dS_ref) > 1e-3
    assert rel_err(dS, dS_ref) < 1e-7, rel_err(dS, dS_ref)
    full_rank = np.linalg.matrix_rank(K) == d_e * d_e
    assert full_rank == (case in ("regular", "anisotropic"))
    if full_rank:
        assert rel_err(P, P_ref) < 1e-7, rel_err(P, P_ref)


@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "causal"])
def test_joint_satisfies_the_normal_equations(masked):
    """Residual of ``Σ_b X_bᵀ(mask ⊙ X_b P X_bᵀ)X_b = Σ_b M_b`` in the dense system, and least squares optimality."""
    b, d_s, d_e = 4, 6, 4
    X = anisotropic_X(b, d_s, d_e, cond=1e2, seed=3)
    mask = causal(d_s) if masked else None
    G = random_G(b, d_s, seed=4, mask=mask)
    P = np64(joint().direction(X, G, mask))
    K, rhs = kron_normal(X, G, mask)
    assert np.linalg.norm(K @ P.reshape(-1) - rhs) <= 1e-8 * np.linalg.norm(rhs)

    # Known optimum: no perturbation of P lowers Σ_b ‖mask ⊙ (G_b − X_b P X_bᵀ)‖².
    Gn = np64(G)

    def objective(Q):
        return float(((Gn - masked_scores_np(X, Q, mask)) ** 2).sum())

    f0 = objective(P)
    g = gen(5)
    for _ in range(5):
        E = np64(torch.randn(d_e, d_e, generator=g, dtype=DT)) * 1e-3
        assert objective(P + E) >= f0 - 1e-12 * f0
    # ...and it beats every formula of docs/mathematics.md §3 on that objective.
    for preset in ("formula1", "formula2", "formula3", "formula4"):
        assert f0 <= objective(np64(strategies.make(preset).direction(X, G, mask))) * (1 + 1e-12)


def test_joint_equals_gram_formula_when_gram_matrices_are_equal():
    """docs/mathematics.md §3: formula 2 is exact when every ``A_b`` is equal (``X_b = Q_b X_0``, ``Q_b``
    orthogonal)."""
    d_s, d_e, b = 6, 4, 5
    X0 = anisotropic_X(1, d_s, d_e, cond=1e2, seed=6)[0]
    X = torch.stack([torch.linalg.qr(torch.randn(d_s, d_s, generator=gen(30 + i), dtype=DT))[0] @ X0 for i in range(b)])
    G = random_G(b, d_s, seed=7)
    assert rel_err(joint().direction(X, G), strategies.make("formula2").direction(X, G)) < 1e-8


def test_joint_differs_from_gram_formula_on_unequal_gram_matrices():
    """Guard: on ordinary inputs the joint solve is not formula 2 (its first CG iterate)."""
    X = anisotropic_X(5, 6, 4, cond=1e2, seed=8)
    G = random_G(5, 6, seed=9)
    assert rel_err(joint().direction(X, G), strategies.make("formula2").direction(X, G)) > 1e-2


def test_joint_cg_not_converged_is_recorded():
    X = anisotropic_X(5, 8, 5, cond=1e3, seed=10)
    G = random_G(5, 8, seed=11)
    W_Q, W_K = factors(5, 1, seed=12)

    def loss(S):
        return 0.5 * ((S - 1.0) ** 2).mean()

    r = joint(maxiter=1).grow(W_Q, W_K, X, G, p=1, loss_of_scores=loss)
    assert any("CG" in m for m in r.fallback), r.fallback
    r = joint().grow(W_Q, W_K, X, G, p=1, loss_of_scores=loss)
    assert not any("CG" in m for m in r.fallback), r.fallback


def test_joint_with_pinv_preconditioner_equals_solve_preconditioner():
    X = anisotropic_X(4, 7, 5, cond=1e2, seed=13)
    mask = causal(7)
    G = random_G(4, 7, seed=14, mask=mask)
    P_solve = joint().direction(X, G, mask)
    pinv = strategies.make("joint/pinv/full/fast:grid", averaging={"tol": 1e-10, "maxiter": 500})
    P_pinv = pinv.direction(X, G, mask)
    assert rel_err(P_pinv, P_solve) < 1e-7
