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


#: The reference projection's stopping rule: residual, energy estimate, iteration cap.
REFERENCE_TOL, REFERENCE_ENERGY_TOL, REFERENCE_MAXITER = 1e-10, 1e-7, 2000


def projection(G: Tensor, X: Tensor, mask: Tensor | None = None, tol: float = REFERENCE_TOL) -> tuple[Tensor, CGInfo]:
    """``ΠG`` and how its solve ended (see :func:`projected_gradient`).

    The solve stops at relative residual ``tol`` or once ``‖ΠG‖²`` has settled to
    ``REFERENCE_ENERGY_TOL`` (:func:`~strategies.cg.pcg`): on real inputs (post-LayerNorm,
    ``d_s < d_e``) the residual stalls near 1e-3 while ``‖ΠG‖`` is exact to 1e-4 and
    better. ``info.converged`` False means ``‖ΠG‖`` is a lower bound, so an optimality
    computed from it is an upper bound.
    """
    G, X, mask = _prepare(G, X, mask)
    N, d_e = X.shape[0], X.shape[-1]
    Xf = X.reshape(-1, d_e)
    rhs = Xf.mT @ (G @ X).reshape(-1, d_e) / N
    log: list[str] = []
    P, info = solve_joint(X, mask, Xf.mT @ Xf / N, rhs, Pinv(rtol=1e-12), tol, REFERENCE_MAXITER, log,
                          energy_tol=REFERENCE_ENERGY_TOL)
    return _scores(X, P, mask), info


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


def quality(G: Tensor, X: Tensor, dZ: Tensor, mask: Tensor | None = None,
            reference: tuple[Tensor, CGInfo] | None = None) -> dict[str, float]:
    """``first_order_decrease``, ``optimality`` and ``bottleneck`` with one projection solve.

    Parameters are as in :func:`first_order_decrease`; ``reference`` is
    :func:`projection`'s result for the same ``G``, ``X``, ``mask`` when the caller
    already has it (it depends on the data, not on the strategy). Also returns
    ``reference_converged`` (1.0, or 0.0 when the projection's solve stopped at its cap:
    ``optimality`` is then an upper bound) and ``reference_residual``.
    """
    mask = check_batch(X, G, mask)
    dZd = _check_dZ(dZ, X.shape[-1])
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
