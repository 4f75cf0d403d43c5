"""The batch-averaging formulas (docs/mathematics.md §3) against brute-force float64 references."""

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
    np64,
    random_G,
    rel_err,
    repeated_tokens_X,
)

from growbench import strategies

RTOL_PINV = 1e-10  # cutoff of the numpy references: far above rounding, far below any real singular value


def pinv(a: np.ndarray) -> np.ndarray:
    return np.linalg.pinv(a, rtol=RTOL_PINV)


def reference(name: str, X: torch.Tensor, G: torch.Tensor) -> np.ndarray:
    """The formula of docs/mathematics.md §3 by an explicit loop over samples and ``numpy.linalg.pinv``."""
    Xn, Gn = np64(X), np64(G)
    b = Xn.shape[0]
    if name == "per-sample":
        return sum(pinv(Xn[i]) @ Gn[i] @ pinv(Xn[i]).T for i in range(b)) / b
    if name == "gram":
        EA = sum(Xn[i].T @ Xn[i] for i in range(b)) / b
        EM = sum(Xn[i].T @ Gn[i] @ Xn[i] for i in range(b)) / b
        return pinv(EA) @ EM @ pinv(EA)
    if name == "mean-input":
        EX, EG = Xn.mean(axis=0), Gn.mean(axis=0)
        return pinv(EX) @ EG @ pinv(EX).T
    raise AssertionError(name)


def inverted_matrix_is_singular(name: str, X: torch.Tensor) -> bool:
    """Whether the Gram matrix that ``solve`` must factorise is singular for these inputs."""
    Xn = np64(X)
    d_e = Xn.shape[-1]
    if name == "per-sample":
        return any(np.linalg.matrix_rank(x) < d_e for x in Xn)
    if name == "gram":
        return np.linalg.matrix_rank(np.concatenate(list(Xn))) < d_e
    return np.linalg.matrix_rank(Xn.mean(axis=0)) < d_e


INPUTS = {
    # anisotropic, full column rank per sample
    "anisotropic": lambda: anisotropic_X(6, 10, 6, cond=1e3, seed=1),
    # d_s < d_e: every X_b is rank-deficient, E[X] too; E[A] is not (b·d_s ≥ d_e)
    "short": lambda: anisotropic_X(4, 3, 8, cond=1e3, seed=2),
    # repeated tokens from a vocabulary smaller than d_e: every matrix is singular
    "repeated": lambda: repeated_tokens_X(4, 6, 7, vocab=3, seed=3),
}
FORMULAS = ["per-sample", "gram", "mean-input"]


@pytest.mark.parametrize("kind", list(INPUTS))
@pytest.mark.parametrize("inverse", ["pinv", "solve"])
@pytest.mark.parametrize("name", FORMULAS)
def test_formula_matches_bruteforce(name, inverse, kind):
    X = INPUTS[kind]()
    G = random_G(X.shape[0], X.shape[1], seed=7)
    s = strategies.make(f"{name}/{inverse}/full/fast:grid")
    P = s.direction(X, G)
    assert P.shape == (X.shape[-1],) * 2 and P.dtype == DT
    ref = reference(name, X, G)
    assert np.abs(ref).max() > 1e-3  # the comparison is not between two zeros
    assert rel_err(P, ref) < 1e-8, f"{name}/{inverse} on {kind}: {rel_err(P, ref):.2e}"


@pytest.mark.parametrize("kind", list(INPUTS))
@pytest.mark.parametrize("name", FORMULAS)
def test_solve_removes_null_directions_or_records_its_fallback(name, kind):
    """Through ``grow``: one singular Gram matrix under ``solve`` has its null directions removed by design
    (counted, no fallback; the direction equals pinv's, checked above); a batch of them (per-sample) falls
    back to pinv and records it; a regular one does neither."""
    X = INPUTS[kind]()
    b, d_s, d_e = X.shape
    G = random_G(b, d_s, seed=7)
    W_Q, W_K = factors(d_e, 1, seed=4)
    singular = inverted_matrix_is_singular(name, X)
    for inverse in ("solve", "pinv"):
        s = strategies.make(f"{name}/{inverse}/full/fast:grid")
        r = s.grow(W_Q, W_K, X, G, p=1, loss_of_scores=attention_loss(b, d_s, seed=5))
        solve_msgs = [m for m in r.fallback if m.startswith("solve")]
        if inverse == "solve" and singular and name == "per-sample":
            assert solve_msgs and all("pinv" in m for m in solve_msgs), r.fallback
        else:
            assert solve_msgs == [], r.fallback
        if inverse == "solve" and name == "gram":
            rank = np.linalg.matrix_rank(np.concatenate(list(np64(X))))
            assert r.info.get("null_directions", 0) == d_e - rank, r.info
        assert torch.isfinite(r.W_Q).all() and torch.isfinite(r.W_K).all()
    if name == "per-sample":
        # The per-sample inverses happen while accumulating: the statistics' own log has them.
        stats = strategies.make(f"{name}/solve/full/fast:grid").new_statistics().update(X, G)
        assert bool(stats.log) == singular


def test_rank_deficient_cases_are_really_singular():
    """Guard for the test above: the inputs cover both the singular and the regular case."""
    assert not inverted_matrix_is_singular("gram", INPUTS["anisotropic"]())
    assert not inverted_matrix_is_singular("per-sample", INPUTS["anisotropic"]())
    assert inverted_matrix_is_singular("per-sample", INPUTS["short"]())
    assert not inverted_matrix_is_singular("gram", INPUTS["short"]())
    for name in FORMULAS:
        assert inverted_matrix_is_singular(name, INPUTS["repeated"]())


def test_gram_formula_equals_per_sample_when_all_gram_matrices_are_equal():
    """With ``X_b = Q_b X_0`` (``Q_b`` orthogonal) every ``A_b`` is equal and formula 2 = formula 1."""
    d_s, d_e, b = 7, 5, 4
    X0 = anisotropic_X(1, d_s, d_e, cond=1e2, seed=11)[0]
    Qs = [torch.linalg.qr(torch.randn(d_s, d_s, generator=gen(20 + i), dtype=DT))[0] for i in range(b)]
    X = torch.stack([Q @ X0 for Q in Qs])
    G = random_G(b, d_s, seed=12)
    P1 = strategies.make("formula1").direction(X, G)
    P2 = strategies.make("formula2").direction(X, G)
    P4 = strategies.make("formula4").direction(X, G)
    assert rel_err(P2, P1) < 1e-9
    assert rel_err(P4, P1) < 1e-9


SPEC_OF = {
    "per-sample": "per-sample/{}/full/fast:grid",
    "gram": "gram/{}/full/fast:grid",
    "mean-input": "mean-input/{}/full/fast:grid",
    "joint": "joint/{}/full/fast:grid",
}


def _make(name: str, inverse: str):
    opts = {"tol": 1e-12, "maxiter": 1000} if name == "joint" else None
    return strategies.make(SPEC_OF[name].format(inverse), averaging=opts)


@pytest.mark.parametrize("inverse", ["pinv", "solve"])
@pytest.mark.parametrize("name", list(SPEC_OF))
def test_streaming_equals_one_concatenated_batch(name, inverse):
    X = anisotropic_X(7, 6, 5, cond=1e2, seed=30)
    G = random_G(7, 6, seed=31)
    s = _make(name, inverse)
    stats = s.new_statistics()
    for lo, hi in ((0, 2), (2, 5), (5, 7)):
        stats.update(X[lo:hi], G[lo:hi])
    assert stats.n == 7
    one = s.new_statistics().update(X, G)
    P_stream, P_one = s.direction(stats), s.direction(one)
    assert rel_err(P_stream, P_one) < 1e-9
    assert rel_err(P_one, s.direction(X, G)) < 1e-12
    # E[·] is over every batch, not the last one: the last batch alone gives another direction.
    assert rel_err(s.direction(X[5:], G[5:]), P_one) > 1e-3


@pytest.mark.parametrize("name", list(SPEC_OF))
def test_streaming_with_masks_equals_concatenated_batch(name):
    """Batches with different masks (causal, none, per-sample) accumulate like one stacked batch."""
    b, d_s, d_e = 6, 6, 4
    X = anisotropic_X(b, d_s, d_e, cond=10.0, seed=40)
    G = random_G(b, d_s, seed=41)
    m = causal(d_s)
    per_sample = torch.rand(2, d_s, d_s, generator=gen(42)) > 0.3
    full = torch.ones(d_s, d_s, dtype=torch.bool)
    s = _make(name, "solve")
    stats = s.new_statistics()
    stats.update(X[:2], G[:2], m)
    stats.update(X[2:4], G[2:4])
    stats.update(X[4:], G[4:], per_sample)
    whole = torch.cat([m.expand(2, -1, -1), full.expand(2, -1, -1), per_sample])
    P_one = s.direction(X, G, whole)
    assert rel_err(s.direction(stats), P_one) < 1e-9
    if name in ("gram", "joint"):
        # The mask matters (G is zeroed outside it): ignoring it gives another direction.
        assert rel_err(s.direction(X, G), P_one) > 1e-3


@pytest.mark.parametrize("name", list(SPEC_OF))
def test_direction_is_raw_and_homogeneous(name):
    """``P`` is unnormalised: linear in ``G`` and of degree −2 in ``X`` (``X_b P X_bᵀ`` fits ``G``)."""
    X = anisotropic_X(5, 7, 4, cond=10.0, seed=50)
    G = random_G(5, 7, seed=51)
    s = _make(name, "solve")
    P = s.direction(X, G)
    assert rel_err(s.direction(X, 3.0 * G), 3.0 * P) < 1e-9
    assert rel_err(s.direction(2.0 * X, G), P / 4.0) < 1e-9
    assert rel_err(s.direction(X, -G), -P) < 1e-12


def test_direction_from_statistics_rejects_statistics_of_another_formula():
    X = anisotropic_X(3, 5, 4, seed=60)
    G = random_G(3, 5, seed=61)
    gram_stats = strategies.make("formula2").new_statistics().update(X, G)
    for spec in ("formula1", "formula3", "joint"):
        with pytest.raises(ValueError, match="new_statistics"):
            strategies.make(spec).direction(gram_stats)


@pytest.mark.parametrize("baseline", ["random", "zero", "gradmax"])
def test_baseline_direction_is_the_plain_gradient(baseline):
    """docs/mathematics.md §2: ``Σ_b M_b = ∂L/∂Z``; the baselines' direction is its mean ``E[M]``."""
    b, d_s, d_e = 3, 6, 4
    X = anisotropic_X(b, d_s, d_e, cond=10.0, seed=70)
    loss = attention_loss(b, d_s, seed=71)
    Z = torch.randn(d_e, d_e, generator=gen(72), dtype=DT).requires_grad_(True)
    S = X @ Z @ X.mT
    G = torch.autograd.grad(loss(S), S, retain_graph=True)[0]
    (dL_dZ,) = torch.autograd.grad(loss(X @ Z @ X.mT), Z)
    assert rel_err(strategies.make(baseline).direction(X, G), dL_dZ / b) < 1e-12
