"""How much of a step's in-sample decrease is signal: the split-half estimate (docs/mathematics.md §5.4).

A direction fitted to a noisy gradient follows the noise of the very samples it is
judged on, so its in-sample slope ``⟨M, P⟩`` is optimistic. Split the samples into two
halves with gradient sums ``M_a``, ``M_b`` and directions ``P_a``, ``P_b`` made the same
way from each (``P = P_a + P_b``). The noise of one half is independent of the other,
so the cross-fitted slope ``2 ⟨M_a, P_b⟩ + 2 ⟨M_b, P_a⟩`` estimates, without that
optimism, the slope the direction has on data drawn like the samples. Its ratio to the
in-sample slope is the *signal share* ``s``; ``1 − s`` of the slope is optimism.

The step the growth takes is the rank-``r`` truncation of ``Z − λP̂``, which already
drops most of the noise spread over many directions. The share is therefore measured
on ``P``'s top-``r`` singular subspace in the truncation's own geometry (the metric of
``E[XᵀX]`` for a ``+metric`` truncation): the whitened directions ``Y = Lᵀ P L`` and
gradients ``N = L⁻¹ M L⁻ᵀ`` (so that ``⟨N, Y⟩ = ⟨M, P⟩``) projected on ``Y``'s top-``r``
left and right singular vectors.

The estimate is computed in the direction's own precision (float32 for float32 inputs; float64 took twice
the time at d_e = 1024): each pair of halves is first divided by one power of two near its magnitude, which
is exact and leaves the ratio unchanged (both of its terms are bilinear in the gradients and the
directions), so no extreme ``G`` overflows or underflows a product. The metric's floor bounds the
whitening's condition number (``Metric``): at most about ``1/sqrt(rtol)``, some 30 at d_e = 1024.

This module imports nothing of the package but :mod:`strategies.truncation` (the metric, and the truncations'
own subspaces) and :mod:`strategies._checks` (``abs_max``, ``pow2_scale``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ._checks import abs_max, pow2_scale
from .truncation import FullSVD, Metric, RandomizedSVD

#: Widths above which the top singular subspace comes from a randomised sketch instead of a full SVD.
LOW_RANK_ABOVE = 1024


def signal_share(gradient_halves: tuple[Tensor, Tensor], direction_halves: tuple[Tensor, Tensor], rank: int,
                 metric: Metric | None = None,
                 top_subspace: Callable[[Tensor, int], tuple[Tensor, Tensor]] | None = None,
                 whitened_direction: Tensor | None = None) -> float:
    """The split-half estimate of the share of the in-sample slope of ``P = P_a + P_b`` that is not optimism.

    Parameters
    ----------
    gradient_halves : (Tensor, Tensor)
        ``M_a``, ``M_b``: ``Σ X_bᵀ G_b X_b`` over each half of the samples, ``(d_e, d_e)`` each.
    direction_halves : (Tensor, Tensor)
        ``P_a``, ``P_b``: the direction made from each half, ``(d_e, d_e)`` each (any common scale).
    rank : int
        ``d_k + p``: the share is measured on ``P``'s top-``rank`` singular subspace.
    metric : Metric, optional
        The truncation's metric; None for a plain (Frobenius) truncation.
    top_subspace : callable, optional
        ``(Y, rank) -> (U, V)``: the subspace the truncation itself would find
        (:meth:`strategies.truncation.Truncation.top_subspace`: a randomised truncation's sketch costs a
        fraction of a full SVD at d_e in the hundreds). Default: a full SVD up to :data:`LOW_RANK_ABOVE`, a
        seeded sketch above.
    whitened_direction : Tensor, optional
        ``Lᵀ (P_a + P_b) L`` in any positive scale (only its top subspace is used), where the caller has it; by
        default made here (``P_a + P_b`` itself without a metric).

    Returns
    -------
    float
        ``2(⟨N_a, ΠY_b⟩ + ⟨N_b, ΠY_a⟩) / ⟨N_a + N_b, Π(Y_a + Y_b)⟩``; NaN when the in-sample slope
        is not positive. Not clamped: a share outside ``[0, 1]`` is noise of the estimate itself.
    """
    dtype = metric.L.dtype if metric is not None else torch.promote_types(*(t.dtype for t in direction_halves))
    M_a, M_b = _in_range(gradient_halves, dtype)
    P_a, P_b = _in_range(direction_halves, dtype)
    if whitened_direction is not None:
        Y = whitened_direction.to(dtype)
    else:
        Y = metric.whiten(P_a + P_b) if metric is not None else P_a + P_b
    U, V = (top_subspace or _default_top_subspace(Y))(Y, rank)
    # Only the halves' cores on that subspace enter the share, and they need no whitened half: Uᵀ (Lᵀ P L) V is
    # (L U)ᵀ P (L V), and Uᵀ (L⁻¹ M L⁻ᵀ) V is (L⁻ᵀ U)ᵀ M (L⁻ᵀ V): products of (d_e, r) factors, in place of two
    # (d_e, d_e) products or solves per half (at d_e = 1024, two thirds of the estimate's time).
    if metric is not None:
        (LU, LV), (UL, VL) = (metric.L @ U, metric.L @ V), (metric.unwhiten(U), metric.unwhiten(V))
    else:
        LU, LV, UL, VL = U, V, U, V

    def core(T: Tensor, left: Tensor, right: Tensor) -> Tensor:  # ⟨A, U Uᵀ B V Vᵀ⟩ = ⟨Uᵀ A V, Uᵀ B V⟩
        return left.mT @ T @ right

    ya, yb = (core(P, LU, LV) for P in (P_a, P_b))
    na, nb = (core(M, UL, VL) for M in (M_a, M_b))
    return _share(na, nb, ya, yb)


def signal_share_whitened(gradient_halves: tuple[Tensor, Tensor], direction_halves: tuple[Tensor, Tensor], rank: int,
                          top_subspace: Callable[[Tensor, int], tuple[Tensor, Tensor]] | None = None,
                          dtype: torch.dtype | None = None) -> float:
    """:func:`signal_share` from halves already in the truncation's geometry, where whitening them cost nothing (in
    the eigenbasis of the metric, :meth:`strategies.truncation.Metric.whiten_rotated`).

    Parameters
    ----------
    gradient_halves : (Tensor, Tensor)
        ``N_a, N_b = L⁻¹ M_a L⁻ᵀ, L⁻¹ M_b L⁻ᵀ``, ``(d_e, d_e)`` each (any common scale).
    direction_halves : (Tensor, Tensor)
        ``Y_a, Y_b = Lᵀ P_a L, Lᵀ P_b L`` in the same basis (any common scale).
    rank, top_subspace :
        As for :func:`signal_share`.
    dtype : torch.dtype, optional
        The precision of the estimate (default the directions').

    Returns
    -------
    float
        The share, as :func:`signal_share` gives it for the same halves and metric (the basis is immaterial:
        both of its terms are inner products of projections on the top subspace, which rotates with it).
    """
    dtype = dtype or direction_halves[0].dtype
    N_a, N_b = _in_range(gradient_halves, dtype)
    Y_a, Y_b = _in_range(direction_halves, dtype)
    Y = Y_a + Y_b
    U, V = (top_subspace or _default_top_subspace(Y))(Y, rank)
    ya, yb, na, nb = (U.mT @ T @ V for T in (Y_a, Y_b, N_a, N_b))
    return _share(na, nb, ya, yb)


def _default_top_subspace(Y: Tensor) -> Callable[[Tensor, int], tuple[Tensor, Tensor]]:
    """A full SVD's top subspace up to :data:`LOW_RANK_ABOVE`, a wide matrix's by the rsvd truncation's seeded
    sketch."""
    return (FullSVD() if Y.shape[-1] <= LOW_RANK_ABOVE else RandomizedSVD()).top_subspace


def _share(na: Tensor, nb: Tensor, ya: Tensor, yb: Tensor) -> float:
    """``2(⟨n_a, y_b⟩ + ⟨n_b, y_a⟩) / ⟨n_a + n_b, y_a + y_b⟩`` of the halves' cores on the top subspace (one host
    read); NaN when the in-sample term is not positive."""
    honest, in_sample = torch.stack([2 * ((na * yb).sum() + (nb * ya).sum()), ((na + nb) * (ya + yb)).sum()]).tolist()
    return honest / in_sample if in_sample > 0 else float("nan")


def _in_range(halves: tuple[Tensor, Tensor], dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Both halves divided by one power of two near their largest entry (exact), then in ``dtype``."""
    a, b = halves
    scale = pow2_scale(torch.stack([abs_max(a), abs_max(b).to(a)]))
    return (a / scale).to(dtype), (b / scale.to(b)).to(dtype)
