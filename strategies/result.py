"""The record a growth returns."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor


@dataclass
class GrowthResult:
    """What one growth produced and what it cost.

    Attributes
    ----------
    W_Q, W_K : Tensor
        New factors, ``(d_e, d_k + p)``, with ``new_scale · W_Q W_Kᵀ = Z'``.
    dZ : Tensor
        ``Z' − Z``, ``(d_e, d_e)``.
    lam : float
        Step along the normalised direction (0 for baselines).
    first_order_decrease : float
        ``−⟨G, X dZ Xᵀ⟩`` on the batch given to ``grow``.
    loss_before, loss_after : float
        ``loss_of_scores`` at the current and at the new scores.
    n_loss_evals : int
        Calls of ``loss_of_scores`` (an AD pass of the Newton search counts as one).
    fallback : list of str
        Every fallback that happened (empty if none): singular matrices handed to pinv,
        CG not converged, a search method replaced by another.
    timings : dict
        Seconds per phase: ``statistics``, ``direction``, ``line_search``, ``truncation``, ``total``.
    spec : str
        Canonical spec of the strategy.
    info : dict
        Solver diagnostics (CG iterations and residual, Newton proposal...).
    """

    W_Q: Tensor
    W_K: Tensor
    dZ: Tensor
    lam: float
    first_order_decrease: float
    loss_before: float
    loss_after: float
    n_loss_evals: int
    fallback: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    spec: str = ""
    info: dict = field(default_factory=dict)
