"""The record a growth returns."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from torch import Tensor


@dataclass
class GrowthResult:
    """What one growth produced and what it cost.

    Every tensor is detached and has the dtype of the inputs (float16/bfloat16 included,
    though computed in float32).

    Attributes
    ----------
    W_Q, W_K : Tensor
        New factors, ``(d_e, d_k + p)``, with ``new_scale · W_Q W_Kᵀ = Z'``.
    dZ : Tensor
        ``Z' − Z``, ``(d_e, d_e)``, of the factors as returned.
    lam : float
        Step along the normalised direction (0 for baselines).
    first_order_decrease : float
        ``−⟨G, X dZ Xᵀ⟩`` on the batch given to ``grow`` (computed before ``dZ`` is
        rounded to a half-precision input's dtype).
    loss_before, loss_after : float
        ``loss_of_scores`` at the current and at the new scores (those of the factors as
        returned). ``loss_after`` may be NaN or Inf only with a ``fallback`` entry saying
        so; see :attr:`loss_after_finite`.
    n_loss_evals : int
        Calls of ``loss_of_scores`` (an AD pass of the Newton search counts as one).
    fallback : list of str
        Every fallback that happened (empty if none): singular matrices handed to pinv,
        CG not converged, a search method replaced by another.
    timings : dict
        Seconds per phase: ``statistics``, ``direction``, ``line_search``, ``truncation``, ``total``.
        ``statistics`` and ``total`` include the caller's statistics (their timed updates) once.
    spec : str
        Canonical spec of the strategy.
    info : dict
        Solver diagnostics (CG iterations and residual, Newton proposal...); ``g_scale``
        when an extreme ``G`` was rescaled by that power of two; ``loss_after_float32``,
        the step's loss before a half-precision input's rounding; ``host_syncs``, every number the
        growth read on the host (a synchronisation each on a GPU); ``statistics_tokens``,
        ``tokens_per_d_e2`` and ``statistics_batches``, the statistics behind the step;
        ``norm_sketch_probes`` and ``norm_sketch_rel_se`` where the unit of λ came from a sketched
        ``‖X P Xᵀ‖`` (:class:`strategies.score_change.SketchedNorms`): its probes and relative standard error;
        ``profile``, the growth section by section (:class:`strategies.timing.Profile`:
        ``{"ms": {section: ms}, "calls": {...}, "loss_call_ms": [...], "total_ms": ...}``). The
        ``default`` preset adds ``default_regime``, ``default_evidence`` (one line: the regime's
        verdict, and where its evidence is) and ``statistics_needed`` (the statistics its evidence
        shows it generalising from).
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

    @property
    def loss_after_finite(self) -> bool:
        """False when ``loss_after`` is NaN or Inf: the growth must not be trusted (see ``fallback``)."""
        return math.isfinite(self.loss_after)
