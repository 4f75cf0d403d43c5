"""The measures of docs/mathematics.md §7 against autograd and a dense Kronecker projection."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import (
    DT,
    anisotropic_X,
    attention_loss,
    causal,
    factors,
    gen,
    grad_of,
    kron_projection,
    masked_scores_np,
    np64,
    random_G,
    rel_err,
)

from growbench import strategies
from growbench.strategies import metrics


def joint_direction(X, G, mask=None):
    return strategies.make("joint/solve/full/fast:grid", averaging={"tol": 1e-10, "maxiter": 500}).direction(X, G, mask)


def setup(masked: bool, seed: int = 0, b: int = 3, d_s: int = 6, d_e: int = 4):
    X = anisotropic_X(b, d_s, d_e, cond=1e2, seed=seed)
    mask = causal(d_s) if masked else None
    W_Q, W_K = factors(d_e, 2, seed=seed + 1)
    S = X @ (W_Q @ W_K.T / np.sqrt(2)) @ X.mT
    loss = attention_loss(b, d_s, seed=seed + 2, mask=mask)
    G = grad_of(loss, S)
    return X, S, G, mask, loss


@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "causal"])
def test_first_order_decrease_is_the_directional_derivative(masked):
    X, S, G, mask, loss = setup(masked)
    if masked:
        assert (G[:, ~mask] == 0).all()  # the real gradient is zero where masked
    g = gen(3)
    for _ in range(3):
        dZ = torch.randn(X.shape[-1], X.shape[-1], generator=g, dtype=DT)
        t = torch.zeros((), dtype=DT, requires_grad=True)
        (slope,) = torch.autograd.grad(loss(S + t * (X @ dZ @ X.mT)), t)
        ref = -float(slope)
        assert abs(ref) > 1e-6
        assert metrics.first_order_decrease(G, X, dZ, mask) == pytest.approx(ref, rel=1e-10, abs=1e-14)
        if masked:
            # Entries outside the mask do not count, whatever G holds there.
            G_junk = G + random_G(*G.shape[:2], seed=4) * ~mask
            assert metrics.first_order_decrease(G_junk, X, dZ, mask) == pytest.approx(ref, rel=1e-10, abs=1e-14)
            assert metrics.first_order_decrease(G_junk, X, dZ) != pytest.approx(ref, rel=1e-6)


@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "causal"])
def test_first_order_decrease_of_a_grow_matches_autograd(masked):
    """``r.first_order_decrease`` is ``−d/dt L(S + t X dZ Xᵀ)`` at 0 for the applied ``dZ``."""
    X, S, G, mask, loss = setup(masked, seed=10)
    W_Q, W_K = factors(X.shape[-1], 2, seed=11)
    r = strategies.make("joint/solve/full+metric/fast:newton").grow(
        W_Q, W_K, X, G, p=1, loss_of_scores=loss, scale=1 / np.sqrt(2), mask=mask
    )
    t = torch.zeros((), dtype=DT, requires_grad=True)
    (slope,) = torch.autograd.grad(loss(S + t * (X @ r.dZ @ X.mT)), t)
    assert r.first_order_decrease == pytest.approx(-float(slope), rel=1e-9, abs=1e-14)
    assert r.first_order_decrease > 0


@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "causal"])
def test_optimality_of_the_joint_direction_is_one(masked):
    for seed in (0, 20):
        X, _, G, mask, _ = setup(masked, seed=seed)
        P = joint_direction(X, G, mask)
        assert metrics.optimality(G, X, -P, mask) == pytest.approx(1.0, abs=1e-6)
        assert metrics.optimality(G, X, P, mask) == pytest.approx(-1.0, abs=1e-6)
        # scale-free
        assert metrics.optimality(G, X, -7.5 * P, mask) == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "causal"])
def test_optimality_bounded_and_matches_kronecker_reference(masked):
    X, _, G, mask, _ = setup(masked, seed=30, b=4, d_s=5, d_e=4)
    PiG = kron_projection(X, G, mask)
    Gn = np64(G) * (1.0 if mask is None else mask.numpy())
    dirs = {p: -strategies.make(p).direction(X, G, mask) for p in ("formula1", "formula2", "formula3", "formula4")}
    g = gen(31)
    for i in range(4):
        dirs[f"random{i}"] = torch.randn(4, 4, generator=g, dtype=DT)
    values = {}
    for name, dZ in dirs.items():
        opt = metrics.optimality(G, X, dZ, mask)
        dS = masked_scores_np(X, np64(dZ), mask)
        ref = -(Gn * dS).sum() / (np.linalg.norm(dS) * np.linalg.norm(PiG))
        assert opt == pytest.approx(ref, rel=1e-7, abs=1e-9), name
        assert -1.0 - 1e-12 <= opt <= 1.0 + 1e-12, name
        values[name] = opt
    # Only the exact joint direction reaches 1: the formulas fall short on these unequal A_b.
    for p in ("formula1", "formula2", "formula3", "formula4"):
        assert values[p] < 1.0 - 1e-6, (p, values[p])


def test_optimality_is_zero_for_a_zero_change():
    X, _, G, _, _ = setup(False)
    assert metrics.optimality(G, X, torch.zeros(4, 4, dtype=DT)) == 0.0


@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "causal"])
def test_projected_gradient_and_bottleneck_match_kronecker_projection(masked):
    refs = []
    for seed, (b, d_s, d_e) in ((40, (3, 6, 3)), (41, (2, 4, 5)), (42, (4, 5, 4))):
        X = anisotropic_X(b, d_s, d_e, cond=1e2, seed=seed)
        mask = causal(d_s) if masked else None
        G = random_G(b, d_s, seed=seed + 1)  # G need not vanish outside the mask: it is masked
        PiG = kron_projection(X, G, mask)
        assert rel_err(metrics.projected_gradient(G, X, mask), PiG) < 1e-7
        Gm = np64(G) * (1.0 if mask is None else mask.numpy())
        ref = np.linalg.norm(PiG) / np.linalg.norm(Gm)
        bn = metrics.bottleneck(G, X, mask)
        # In [0, 1] up to the float64 PCG tolerance of the projection (1e-10).
        assert 0.0 <= bn <= 1.0 + 1e-9
        assert bn == pytest.approx(ref, rel=1e-7)
        refs.append(ref)
    assert min(refs) < 0.9  # a random G is not reachable: the measure is not trivially 1


@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "causal"])
def test_bottleneck_is_one_for_a_reachable_gradient(masked):
    b, d_s, d_e = 3, 6, 4
    X = anisotropic_X(b, d_s, d_e, cond=10.0, seed=50)
    mask = causal(d_s) if masked else None
    P = torch.randn(d_e, d_e, generator=gen(51), dtype=DT)
    G = X @ P @ X.mT
    if mask is not None:
        G = G * mask
    assert metrics.bottleneck(G, X, mask) == pytest.approx(1.0, abs=1e-8)
    # G reachable by P itself: the joint direction recovers it, and ΠG = G.
    assert rel_err(metrics.projected_gradient(G, X, mask), G) < 1e-8
    assert metrics.optimality(G, X, -P, mask) == pytest.approx(1.0, abs=1e-8)


def test_bottleneck_zero_gradient():
    X = anisotropic_X(2, 4, 3, seed=60)
    assert metrics.bottleneck(torch.zeros(2, 4, 4, dtype=DT), X) == 0.0
