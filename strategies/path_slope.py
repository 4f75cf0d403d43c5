"""The truncated path's slope at ``λ = 0⁺`` (docs/mathematics.md §5.1).

Along the normal path ``λ ↦ X T_r(Z − λP̂) Xᵀ`` the step is truncated to rank ``r``. For a small ``λ > 0`` the
truncation keeps ``Z``'s ``k = rank Z`` directions, moved to first order by ``P̂``'s parts that touch ``Z``'s
column or row space, and of ``C = (I − Π_U) P̂ (I − Π_V)``, the part of ``P̂`` outside both, only the best
rank ``r − k``. So

    d/dλ T_r(Z − λP̂) at 0⁺ = −P̂ + C − T_{r−k}(C),

in the metric's whitened coordinates under ``+metric``, and the path's slope is ``⟨M, ·⟩`` of that with
``M = Σ_b X_bᵀ G_b X_b``. It equals the untruncated slope ``−⟨M, P̂⟩`` when ``rank C ≤ r − k`` and is shallower
otherwise (``⟨M_w, C − T_{r−k}(C)⟩`` is the gradient's share in the directions the truncation drops). Where the
inputs are wide and the rank small (the scale set's ``d_e = 1024``: 0.56 of the untruncated slope, 0.34 with the
``+shrink`` penalty added to both) a search that models the loss along the truncated path from the untruncated
slope misplaces its trials.

Every product here is ``(d_e, d_e) @ (d_e, k)`` or narrower, and one rank-``(r − k)`` truncation of ``C``: about
one trial's truncation.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .timing import section
from .truncation import Metric, Truncation


def truncated_path_slope(M: Tensor, P_hat: Tensor, Z_factors: tuple[Tensor, Tensor], rank: int,
                         truncation: Truncation, metric: Metric | None = None,
                         P_whitened: Tensor | None = None) -> Tensor:
    """``⟨M, d/dλ T_r(Z − λP̂)⟩`` at ``λ = 0⁺`` (in the metric where one is given), a 0-dim tensor.

    Parameters
    ----------
    M : Tensor
        ``(d_e, d_e)``: ``Σ_b X_bᵀ G_b X_b`` over the samples the path moves; ``−⟨M, P̂⟩`` is the untruncated
        path's slope.
    P_hat : Tensor
        ``(d_e, d_e)``, the step's direction.
    Z_factors : (Tensor, Tensor)
        ``(A, B)`` with ``Z = A Bᵀ``, ``(d_e, d_k)`` each (columns may be zero: ``Z``'s rank is found).
    rank : int
        ``r``, the rank the truncation keeps.
    truncation : Truncation
        The strategy's truncation; it truncates ``C`` (already whitened: no metric of its own).
    metric : Metric, optional
        The inputs' metric of a ``+metric`` truncation.
    P_whitened : Tensor, optional
        ``Lᵀ P̂ L`` where the caller has it.

    Returns
    -------
    Tensor
        The slope, 0-dim, in ``M``'s units (not read on the host here).
    """
    with section("path slope"):
        A, B = Z_factors
        whiten = (lambda F: F) if metric is None else (lambda F: metric.L.mT @ F)
        P_w = P_hat if metric is None else (P_whitened if P_whitened is not None else metric.whiten(P_hat))
        U, V = _column_and_row_spaces(whiten(A), whiten(B))
        # In the original coordinates: Ũ = L^{-T} U (what the metric's factors unwhiten to) and Û = L U, so that
        # ⟨L^{-1} M L^{-T}, U Uᵀ P_w⟩ = ⟨Ũᵀ M, Ûᵀ P̂⟩; without a metric both are U.
        U_t, V_t = (U, V) if metric is None else (metric.unwhiten(U), metric.unwhiten(V))
        U_h, V_h = (U, V) if metric is None else (metric.L @ U, metric.L @ V)
        UP, PV = U.mT @ P_w, P_w @ V
        C = P_w - U @ UP - PV @ V.mT + U @ (UP @ V) @ V.mT
        UM, MV = U_t.mT @ M, M @ V_t
        # −⟨M, P̂ − C⟩: the untruncated slope less C's share, computed without forming L^{-1} M L^{-T}.
        kept = -(UM * (U_h.mT @ P_hat)).sum() - (MV * (P_hat @ V_h)).sum() + ((UM @ V_t) * (U_h.mT @ P_hat @ V_h)).sum()
        left = rank - U.shape[1]
        if left <= 0:
            return kept
        Uc, sc, Vc = truncation.triplets(C, left)
        if metric is not None:
            Uc, Vc = metric.unwhiten(Uc), metric.unwhiten(Vc)
        return kept - (sc * ((Uc.mT @ M) * Vc.mT).sum(dim=1)).sum()


def _column_and_row_spaces(A: Tensor, B: Tensor) -> tuple[Tensor, Tensor]:
    """Orthonormal bases ``(d_e, k)`` of the column and row spaces of ``A Bᵀ``, ``k`` its numerical rank (one host
    read): zero or dependent columns of the factors (a growth that appended zero columns) span nothing."""
    Qa, Ra = torch.linalg.qr(A)
    Qb, Rb = torch.linalg.qr(B)
    W, s, Yh = torch.linalg.svd(Ra @ Rb.mT)
    tol = 10 * A.shape[0] * torch.finfo(A.dtype).eps * s[:1]
    k = int((s > tol).sum()) if s.numel() else 0
    return Qa @ W[:, :k], Qb @ Yh[:k].mT
