"""Scale-free quality measures of one growth (docs/mathematics.md §7).

All are computed in float64: they are measurement tools and test oracles, not part
of a strategy's cost.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._checks import check_batch, check_finite
from .averaging import solve_joint
from .cg import CGInfo
from .inverse import Pinv


def _prepare(G: Tensor, X: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor, Tensor | None]:
    mask = check_batch(X, G, mask)
    G, X = G.double(), X.double()
    if mask is not None:
        G = G.masked_fill(~mask, 0.0)
    return G, X, mask


def _scores(X: Tensor, dZ: Tensor, mask: Tensor | None) -> Tensor:
    dS = X @ dZ @ X.mT
    return dS if mask is None else dS * mask


def _check_dZ(dZ: Tensor, d_e: int) -> Tensor:
    check_finite("dZ", dZ)
    if dZ.shape != (d_e, d_e):
        raise ValueError(f"dZ must have shape (d_e, d_e) = {(d_e, d_e)}, got {tuple(dZ.shape)}")
    return dZ.double()


def first_order_decrease(G: Tensor, X: Tensor, dZ: Tensor, mask: Tensor | None = None) -> float:
    """``−⟨G, dS⟩`` for ``dS_b = X_b dZ X_bᵀ`` (masked): the loss decrease to first order.

    Parameters
    ----------
    G : Tensor
        ``∂L/∂S``, ``(b, d_s, d_s)``.
    X : Tensor
        ``(b, d_s, d_e)``.
    dZ : Tensor
        Change of ``Z = c W_Q W_Kᵀ``, ``(d_e, d_e)``.
    mask : Tensor, optional
        Bool ``(d_s, d_s)`` or ``(b, d_s, d_s)``, True where attended.
    """
    G, X, mask = _prepare(G, X, mask)
    dZ = _check_dZ(dZ, X.shape[-1])
    # ⟨G, X dZ Xᵀ⟩ = ⟨Σ_b X_bᵀ G_b X_b, dZ⟩: no (b, d_s, d_s) intermediate.
    d_e = X.shape[-1]
    M = X.reshape(-1, d_e).mT @ (G @ X).reshape(-1, d_e)
    return float(-(M * dZ).sum())


#: The reference projection's iterative stopping rule (widths above :data:`REFERENCE_DENSE_MAX_D_E`): residual and
#: iteration cap, nothing else, so that it stops at the same iteration wherever it runs. On the real model's heads
#: (d_e = 385, residual stalling near 1e-4) ``‖ΠG‖`` moves by 2e-5 relative between 300 and 1000 iterations.
REFERENCE_TOL, REFERENCE_MAXITER = 1e-10, 300
#: Widths up to which the reference projection is solved densely: the joint operator as a ``(d_e², d_e²)``
#: matrix (8 MB at 32) and one symmetric eigendecomposition, the same answer wherever it runs.
REFERENCE_DENSE_MAX_D_E = 32
#: Curvatures of the joint operator below this share of its largest are left out of the reference projection:
#: float32 inputs' rounding (1.2e-7) sets those directions (docs/mathematics.md §7.3). Nearer 0 the projection
#: is not a function of the data: on digits a 1e-7 perturbation of the inputs moves ``‖ΠG‖`` by 7 % at 1e-13.
REFERENCE_RCOND = float(torch.finfo(torch.float32).eps)
#: Bumped when the reference projection's definition or solve changes: part of its cache key.
REFERENCE_VERSION = 2


def projection(G: Tensor, X: Tensor, mask: Tensor | None = None, tol: float = REFERENCE_TOL) -> tuple[Tensor, CGInfo]:
    """``ΠG`` and how its solve ended (see :func:`projected_gradient`).

    Up to ``d_e = REFERENCE_DENSE_MAX_D_E`` the normal equations are solved densely on the
    operator's curvatures above ``REFERENCE_RCOND`` of the largest (:func:`joint_matrix`);
    ``info.iterations`` is then 0 and ``info.residual`` the kept system's relative residual.
    Wider, by preconditioned CG to relative residual ``tol`` or ``REFERENCE_MAXITER``
    iterations. ``info.converged`` False means ``‖ΠG‖`` is a lower bound (CG's energy only
    rises), so an optimality computed from it is an upper bound.
    """
    G, X, mask = _prepare(G, X, mask)
    N, d_e = X.shape[0], X.shape[-1]
    Xf = X.reshape(-1, d_e)
    rhs = Xf.mT @ (G @ X).reshape(-1, d_e) / N
    if d_e <= REFERENCE_DENSE_MAX_D_E:
        P, info = _dense_solve(joint_matrix(X, mask), rhs)
    else:
        P, info = solve_joint(X, mask, Xf.mT @ Xf / N, rhs, Pinv(rtol=1e-12), tol, REFERENCE_MAXITER, [])
    return _scores(X, P, mask), info


def joint_matrix(X: Tensor, mask: Tensor | None = None) -> Tensor:
    """The joint operator ``P ↦ (1/N) Σ_b X_bᵀ (mask_b ⊙ X_b P X_bᵀ) X_b`` as a ``(d_e², d_e²)`` matrix on ``vec P``
    (row-major), for ``X (N, d_s, d_e)``.

    Without a mask it is ``(1/N) Σ_b A_b ⊗ A_b`` for ``A_b = X_bᵀ X_b``. With one, row ``i`` of a sample
    pairs ``x_i x_iᵀ`` with ``B_i = Σ_j mask_ij x_j x_jᵀ``: ``(1/N) Σ_{b,i} (x_i x_iᵀ) ⊗ B_i``, one GEMM.
    """
    N, d_s, d_e = X.shape
    if mask is None:
        A = (X.mT @ X).reshape(N, d_e * d_e)
        outer = A.mT @ A  # Σ_b vec(A_b) vec(A_b)ᵀ, indexed (a, a'), (c, c')
    else:
        m = mask.expand(N, d_s, d_s).to(X.dtype)
        U = torch.einsum("bia,bic->biac", X, X).reshape(N * d_s, d_e * d_e)
        B = torch.einsum("bij,bja,bjc->biac", m, X, X).reshape(N * d_s, d_e * d_e)
        outer = U.mT @ B
    # ⟨vec(x xᵀ) vec(B)ᵀ⟩ indexed (a, a', c, c') -> (a, c), (a', c'): the Kronecker product's order.
    return outer.reshape(d_e, d_e, d_e, d_e).permute(0, 2, 1, 3).reshape(d_e * d_e, d_e * d_e) / N


def _dense_solve(H: Tensor, rhs: Tensor) -> tuple[Tensor, CGInfo]:
    """``P`` solving ``H vec P = vec rhs`` on the eigenvectors of ``H`` above ``REFERENCE_RCOND`` of its largest."""
    d_e = rhs.shape[-1]
    w, V = torch.linalg.eigh(H)
    keep = w > REFERENCE_RCOND * w[-1].clamp_min(0)
    coef = V.mT @ rhs.reshape(-1)
    if not bool(keep.any()):
        return torch.zeros_like(rhs), CGInfo(0, 0.0, True)
    P = (V[:, keep] @ (coef[keep] / w[keep])).reshape(d_e, d_e)
    kept_rhs = V[:, keep] @ coef[keep]
    denom = float(torch.linalg.vector_norm(kept_rhs))
    residual = float(torch.linalg.vector_norm(H @ P.reshape(-1) - kept_rhs)) / denom if denom > 0 else 0.0
    return P, CGInfo(0, residual, True)


def projected_gradient(G: Tensor, X: Tensor, mask: Tensor | None = None, tol: float = REFERENCE_TOL) -> Tensor:
    """``ΠG = (X_b P* X_bᵀ)_b``: the projection of ``G`` on every reachable score change, ``(b, d_s, d_s)``.

    ``P*`` solves the joint normal equations (float64 PCG, see :func:`projection`).
    The projection is unique even where ``P*`` is not.
    """
    return projection(G, X, mask, tol)[0]


def optimality(G: Tensor, X: Tensor, dZ: Tensor, mask: Tensor | None = None) -> float:
    """``−⟨G, dS⟩ / (‖dS‖ · ‖ΠG‖)`` in ``[−1, 1]``; 1 only for the exact joint direction.

    Parameters are as in :func:`first_order_decrease`. Returns 0 when ``dS = 0`` or
    when no change of ``Z`` can follow ``G`` (``ΠG = 0``).
    """
    dS_norm = float(torch.linalg.vector_norm(_scores(X.double(), _check_dZ(dZ, X.shape[-1]), check_batch(X, G, mask))))
    pg_norm = float(torch.linalg.vector_norm(projected_gradient(G, X, mask)))
    if dS_norm == 0.0 or pg_norm == 0.0:
        return 0.0
    return first_order_decrease(G, X, dZ, mask) / (dS_norm * pg_norm)


def bottleneck(G: Tensor, X: Tensor, mask: Tensor | None = None) -> float:
    """``‖ΠG‖ / ‖G‖``: the share of the functional gradient any change of ``Z`` can follow."""
    Gd, _, mask_ = _prepare(G, X, mask)
    g_norm = float(torch.linalg.vector_norm(Gd))
    if g_norm == 0.0:
        return 0.0
    return float(torch.linalg.vector_norm(projected_gradient(G, X, mask))) / g_norm


#: A change of ``Z`` at most this share of ``‖Z‖`` is the rounding of rebuilding ``Z`` (the new scale times the
#: grown factors' product, in float32), not a step: its direction is noise and its optimality 0.
ZERO_STEP_RTOL = 64 * float(torch.finfo(torch.float32).eps)


def quality(G: Tensor, X: Tensor, dZ: Tensor, mask: Tensor | None = None,
            reference: tuple[Tensor, CGInfo] | None = None, Z: Tensor | None = None) -> dict[str, float]:
    """``first_order_decrease``, ``optimality`` and ``bottleneck`` with one projection solve.

    Parameters are as in :func:`first_order_decrease`; ``reference`` is
    :func:`projection`'s result for the same ``G``, ``X``, ``mask`` when the caller
    already has it (it depends on the data, not on the strategy). Also returns
    ``reference_converged`` (1.0, or 0.0 when the projection's solve stopped at its cap:
    ``optimality`` is then an upper bound) and ``reference_residual``. With ``Z (d_e, d_e)``, the
    product before the step, a ``dZ`` with ``‖dZ‖ ≤ ZERO_STEP_RTOL · ‖Z‖`` counts as no step
    (optimality and first-order decrease 0).
    """
    mask = check_batch(X, G, mask)
    dZd = _check_dZ(dZ, X.shape[-1])
    if Z is not None and float(torch.linalg.matrix_norm(dZd)) <= ZERO_STEP_RTOL * float(torch.linalg.matrix_norm(Z)):
        dZ = dZd = torch.zeros_like(dZd)
    PiG, info = projection(G, X, mask) if reference is None else reference
    pg_norm = float(torch.linalg.vector_norm(PiG))
    g_norm = float(torch.linalg.vector_norm(_prepare(G, X, mask)[0]))
    dS_norm = float(torch.linalg.vector_norm(_scores(X.double(), dZd, mask)))
    fod = first_order_decrease(G, X, dZ, mask)
    return {
        "first_order_decrease": fod,
        "optimality": 0.0 if dS_norm == 0.0 or pg_norm == 0.0 else fod / (dS_norm * pg_norm),
        "bottleneck": 0.0 if g_norm == 0.0 else pg_norm / g_norm,
        "reference_converged": float(info.converged),
        "reference_residual": info.residual,
    }
