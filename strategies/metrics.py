"""Scale-free quality measures of one growth (MATH §7).

All are computed in float64: they are measurement tools and test oracles, not part
of a strategy's cost.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._checks import check_batch, check_finite
from .averaging import solve_joint
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


def projected_gradient(G: Tensor, X: Tensor, mask: Tensor | None = None, tol: float = 1e-10) -> Tensor:
    """``ΠG = (X_b P* X_bᵀ)_b``: the projection of ``G`` on every reachable score change, ``(b, d_s, d_s)``.

    ``P*`` solves the joint normal equations (float64 PCG to relative residual ``tol``).
    The projection is unique even where ``P*`` is not.
    """
    G, X, mask = _prepare(G, X, mask)
    N, d_e = X.shape[0], X.shape[-1]
    Xf = X.reshape(-1, d_e)
    rhs = Xf.mT @ (G @ X).reshape(-1, d_e) / N
    log: list[str] = []
    P, _ = solve_joint(X, mask, Xf.mT @ Xf / N, rhs, Pinv(rtol=1e-12), tol, 2000, log)
    return _scores(X, P, mask)


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


def quality(G: Tensor, X: Tensor, dZ: Tensor, mask: Tensor | None = None) -> dict[str, float]:
    """``first_order_decrease``, ``optimality`` and ``bottleneck`` with one projection solve.

    Parameters are as in :func:`first_order_decrease`.
    """
    mask = check_batch(X, G, mask)
    dZd = _check_dZ(dZ, X.shape[-1])
    pg_norm = float(torch.linalg.vector_norm(projected_gradient(G, X, mask)))
    g_norm = float(torch.linalg.vector_norm(_prepare(G, X, mask)[0]))
    dS_norm = float(torch.linalg.vector_norm(_scores(X.double(), dZd, mask)))
    fod = first_order_decrease(G, X, dZ, mask)
    return {
        "first_order_decrease": fod,
        "optimality": 0.0 if dS_norm == 0.0 or pg_norm == 0.0 else fod / (dS_norm * pg_norm),
        "bottleneck": 0.0 if g_norm == 0.0 else pg_norm / g_norm,
    }
