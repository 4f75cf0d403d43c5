"""The reference projection ΠG behind optimality (docs/mathematics.md §7.3): its dense solve against a numpy
Kronecker oracle, its iterative solve against its dense one, its stability under rounding-level changes of the
inputs, and a step of no size counting as no step."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import anisotropic_X, causal, kron_normal, kron_projection, random_G, rel_err

from growbench.strategies import metrics

DT = torch.float64


@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "causal"])
def test_joint_matrix_is_the_kronecker_normal_matrix(masked):
    X = anisotropic_X(5, 6, 4, cond=1e2, seed=3).to(DT)
    mask = causal(6) if masked else None
    K, _ = kron_normal(X, random_G(5, 6, seed=4), mask)
    assert rel_err(metrics.joint_matrix(X, mask), K) < 1e-12


@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "causal"])
def test_dense_and_iterative_reference_agree_on_a_well_posed_problem(monkeypatch, masked):
    """Above REFERENCE_DENSE_MAX_D_E the projection is CG's: both give the oracle's ΠG where the operator is
    well conditioned."""
    X = anisotropic_X(24, 8, 6, cond=10.0, seed=5).to(DT)
    mask = causal(8) if masked else None
    G = random_G(24, 8, seed=6).to(DT)
    oracle = kron_projection(X, G, mask)
    dense, info = metrics.projection(G, X, mask)
    assert info.iterations == 0 and info.converged
    monkeypatch.setattr(metrics, "REFERENCE_DENSE_MAX_D_E", 0)
    iterative, cg = metrics.projection(G, X, mask)
    assert cg.iterations > 0 and cg.converged
    assert rel_err(dense, oracle) < 1e-9
    assert rel_err(iterative, oracle) < 1e-7


def _tapering_X(seed: int) -> torch.Tensor:
    """Float32 inputs whose joint operator's curvatures taper from 1 to far below float32's rounding, as on the
    digits data (pixels that hardly vary): the regime where ΠG stopped being a function of the data."""
    g = torch.Generator().manual_seed(seed)
    d_e = 12
    spectrum = torch.logspace(0, -5, d_e, dtype=DT)
    Q, _ = torch.linalg.qr(torch.randn(d_e, d_e, generator=g, dtype=DT))
    return (torch.randn(64, 6, d_e, generator=g, dtype=DT) * spectrum @ Q.mT).float()


def test_reference_norm_is_stable_under_rounding_level_changes_of_the_inputs():
    """A 1e-7 relative change of X and G (what another machine's float32 rounding does) moves ‖ΠG‖ by far less
    than the 1e-4 to which optimality is compared between runs."""
    X = _tapering_X(7)
    G = random_G(64, 6, seed=8).float()
    g = torch.Generator().manual_seed(9)
    X2 = X * (1 + 1e-7 * torch.randn(X.shape, generator=g))
    G2 = G * (1 + 1e-7 * torch.randn(G.shape, generator=g))
    norms = [float(torch.linalg.vector_norm(metrics.projected_gradient(g_, x_))) for x_, g_ in ((X, G), (X2, G2))]
    assert abs(norms[0] - norms[1]) / norms[0] < 1e-5
    # The cutoff is what makes it so: the curvatures it leaves out are there, and would count without it.
    H = metrics.joint_matrix(X.double())
    w = torch.linalg.eigvalsh(H)
    assert int((w < metrics.REFERENCE_RCOND * w[-1]).sum()) > 0


def test_a_step_of_rounding_size_has_optimality_zero():
    X = anisotropic_X(6, 5, 4, cond=1e2, seed=11).to(DT)
    G = random_G(6, 5, seed=12).to(DT)
    Z = torch.randn(4, 4, generator=torch.Generator().manual_seed(13), dtype=DT)
    step = -torch.from_numpy(np.linalg.lstsq(*kron_normal(X, G), rcond=None)[0].reshape(4, 4))
    step = step / torch.linalg.matrix_norm(step) * torch.linalg.matrix_norm(Z)
    noise = 10 * torch.finfo(torch.float32).eps * step  # what rebuilding Z in float32 leaves behind
    assert metrics.quality(G, X, noise, Z=Z)["optimality"] == 0.0
    assert metrics.quality(G, X, noise)["optimality"] == pytest.approx(1.0)  # without Z it is judged as a step
    assert metrics.quality(G, X, 1e-3 * step, Z=Z)["optimality"] == pytest.approx(1.0)
