"""A growth strategy: averaging × inverse × truncation × line search, composed.

``Strategy`` holds what every strategy (including the baselines) shares: input
validation, statistics, the loss bookkeeping and the result record. ``GrowthStrategy``
is the functional-gradient growth of MATH §2–5.
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ._checks import check_batch, check_factors, check_scale
from .averaging import Averaging
from .line_search import LineSearch, SearchProblem
from .result import GrowthResult
from .statistics import Statistics
from .timing import synchronize, timed
from .truncation import Metric, Truncation


class _CountedLoss:
    """Wraps ``loss_of_scores`` to count its calls and check what it returns."""

    def __init__(self, fn: Callable[[Tensor], Tensor]) -> None:
        if not callable(fn):
            raise ValueError(f"loss_of_scores must be callable (scores -> scalar loss), got {type(fn).__name__}")
        self.fn = fn
        self.calls = 0

    def __call__(self, S: Tensor) -> Tensor:
        self.calls += 1
        out = self.fn(S)
        if not torch.is_tensor(out) or out.numel() != 1:
            raise ValueError(f"loss_of_scores must return a scalar tensor, got {out!r:.80}")
        return out.reshape(())


@dataclass
class StepContext:
    """What ``grow`` hands to a strategy's step, and what the step hands back.

    Attributes
    ----------
    X, G : Tensor
        The batch λ is chosen on, ``(b, d_s, d_e)`` and ``(b, d_s, d_s)``.
    mask : Tensor or None
        Bool, broadcastable to ``(b, d_s, d_s)``.
    loss : callable
        ``loss_of_scores`` (counted, inside ``grow``).
    Z : Tensor
        ``c W_Q W_Kᵀ``, ``(d_e, d_e)``.
    S0 : Tensor
        The current scores, ``(b, d_s, d_s)``.
    loss0 : float
        ``loss(S0)``.
    scale, new_scale : float
        ``c`` before and ``c'`` after the growth.
    log : list of str
        Fallbacks.
    info : dict
        Diagnostics.
    timings : dict
        Seconds per phase.
    M_batch : Tensor or None
        ``Σ_b X_bᵀ G_b X_b`` of this batch when the statistics were built from it alone.
    loss_after : float or None
        Set by a step that has already evaluated the loss at its result.
    """

    X: Tensor
    G: Tensor
    mask: Tensor | None
    loss: Callable[[Tensor], Tensor]
    Z: Tensor
    S0: Tensor
    loss0: float
    scale: float
    new_scale: float
    log: list[str] = field(default_factory=list)
    info: dict = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    M_batch: Tensor | None = None
    loss_after: float | None = None


class Strategy(ABC):
    """Common interface: ``new_statistics``, ``direction``, ``grow``."""

    spec: str = ""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec!r})"

    @abstractmethod
    def new_statistics(self) -> Statistics:
        """Empty statistics of the kind this strategy needs."""

    @abstractmethod
    def _direction(self, stats: Statistics, log: list[str], info: dict) -> Tensor:
        """Raw direction from statistics."""

    @abstractmethod
    def _step(
        self, ctx: StepContext, W_Q: Tensor, W_K: Tensor, stats: Statistics, p: int
    ) -> tuple[Tensor, Tensor, float]:
        """The new factors and λ; may set ``ctx.loss_after``."""

    def _stats(self, X: Tensor, G: Tensor, mask: Tensor | None, stats: Statistics | None) -> Statistics:
        if stats is None:
            return self.new_statistics()._add(X, G, mask)  # grow() has validated the batch
        if type(stats) is not type(self.new_statistics()):
            raise ValueError(
                f"stats of type {type(stats).__name__} do not fit {self.spec!r}: use this strategy's new_statistics()"
            )
        stats._require()
        if stats.sum_A.shape[-1] != X.shape[-1]:
            raise ValueError(f"stats have d_e={stats.sum_A.shape[-1]} but X has d_e={X.shape[-1]}")
        return stats

    def direction(self, X: Tensor | Statistics, G: Tensor | None = None, mask: Tensor | None = None) -> Tensor:
        """The raw (unnormalised) direction ``P``.

        Parameters
        ----------
        X : Tensor or Statistics
            A batch ``(b, d_s, d_e)`` (then ``G`` is required), or statistics accumulated
            over any number of batches by ``new_statistics().update(...)``.
        G : Tensor, optional
            ``∂L/∂S``, ``(b, d_s, d_s)``.
        mask : Tensor, optional
            Bool ``(d_s, d_s)`` or ``(b, d_s, d_s)``, True where attended.

        Returns
        -------
        Tensor
            ``(d_e, d_e)``.
        """
        if isinstance(X, Statistics):
            if G is not None:
                raise ValueError("pass either statistics or (X, G), not both")
            stats = X
            stats._require()
        else:
            if G is None:
                raise ValueError("direction(X, G): G is required when X is a tensor")
            stats = self.new_statistics().update(X, G, mask)
        with torch.no_grad():
            P = self._direction(stats, [], {})
        _check_direction(bool(torch.isfinite(P).all()))
        return P

    def grow(
        self,
        W_Q: Tensor,
        W_K: Tensor,
        X: Tensor,
        G: Tensor,
        p: int,
        loss_of_scores: Callable[[Tensor], Tensor],
        scale: float | None = None,
        new_scale: float | None = None,
        mask: Tensor | None = None,
        stats: Statistics | None = None,
    ) -> GrowthResult:
        """Grow ``d_k`` by ``p``.

        Parameters
        ----------
        W_Q, W_K : Tensor
            Current factors, ``(d_e, d_k)`` (``d_e`` includes the bias column, if any).
        X : Tensor
            Inputs as the projections see them, ``(b, d_s, d_e)``; λ is chosen on this batch.
        G : Tensor
            ``∂L/∂S`` on that batch, ``(b, d_s, d_s)``.
        p : int
            New columns; ``d_k + p ≤ d_e``.
        loss_of_scores : callable
            Scores ``(b, d_s, d_s)`` -> scalar loss of the rest of the model on that batch.
        scale : float, optional
            Current ``c`` (default ``1/sqrt(d_k)``).
        new_scale : float, optional
            ``c'`` after growth (default: ``scale``). The factors are built so that
            ``new_scale · W_Q' W_K'ᵀ = Z'``; pass ``1/sqrt(d_k + p)`` for the rescale policy.
        mask : Tensor, optional
            Bool ``(d_s, d_s)`` or ``(b, d_s, d_s)``, True where attended.
        stats : Statistics, optional
            Statistics from any number of batches; the direction comes from them
            instead of from ``(X, G)`` alone.

        Returns
        -------
        GrowthResult
        """
        t_start = time.perf_counter()
        mask = check_batch(X, G, mask)
        d_k = check_factors(W_Q, W_K, X.shape[-1], p)
        if W_Q.dtype != X.dtype or W_Q.device != X.device:
            raise ValueError(f"W_Q/W_K ({W_Q.dtype}, {W_Q.device}) must match X ({X.dtype}, {X.device})")
        scale = check_scale("scale", 1.0 / math.sqrt(max(d_k, 1)) if scale is None else scale)
        new_scale = check_scale("new_scale", scale if new_scale is None else new_scale)
        loss = _CountedLoss(loss_of_scores)
        own_stats = stats is None
        stats = self._stats(X, G, mask, stats)
        with torch.no_grad():
            Z = scale * W_Q @ W_K.mT
            S0 = scale * (X @ W_Q) @ (X @ W_K).mT  # through the rank-d_k factors: cheaper than X Z Xᵀ
            loss0 = float(loss(S0))
        if not math.isfinite(loss0):
            raise ValueError(f"loss_of_scores returned {loss0} at the current scores: cannot measure a decrease")
        ctx = StepContext(X=X, G=G, mask=mask, loss=loss, Z=Z, S0=S0, loss0=loss0, scale=scale, new_scale=new_scale,
                          log=list(stats.log), timings={"statistics": stats.elapsed},
                          M_batch=stats.sum_M if own_stats else None)
        W_Q2, W_K2, lam = self._step(ctx, W_Q, W_K, stats, p)
        log, info, timings = ctx.log, ctx.info, ctx.timings
        for name, W in (("W_Q", W_Q2), ("W_K", W_K2)):
            if not bool(torch.isfinite(W).all()):
                raise FloatingPointError(f"{self.spec}: new {name} is not finite (fallbacks: {log})")
        with torch.no_grad():
            dZ = new_scale * W_Q2 @ W_K2.mT - Z
            if ctx.loss_after is not None:
                loss_after = ctx.loss_after
            else:
                loss_after = float(loss(new_scale * (X @ W_Q2) @ (X @ W_K2).mT))
            # -<G, X dZ Xᵀ> = -<Σ_b X_bᵀ G_b X_b, dZ>: reuse the batch's own sum when the
            # statistics were built from it, else one pass over the batch.
            M = ctx.M_batch
            if M is None:
                Gm = G if mask is None else G.masked_fill(~mask, 0.0)
                M = X.reshape(-1, X.shape[-1]).mT @ (Gm @ X).reshape(-1, X.shape[-1])
            first_order = float(-(M * dZ).sum())
        synchronize(X.device)
        timings["total"] = time.perf_counter() - t_start + (timings["statistics"] if not own_stats else 0.0)
        return GrowthResult(
            W_Q=W_Q2,
            W_K=W_K2,
            dZ=dZ,
            lam=float(lam),
            first_order_decrease=first_order,
            loss_before=loss0,
            loss_after=loss_after,
            n_loss_evals=loss.calls,
            fallback=log,
            timings=timings,
            spec=self.spec,
            info=info,
        )


def _check_direction(finite: bool) -> None:
    """Refuse a direction with NaN/Inf entries (``finite`` says whether every entry of ``P`` is finite)."""
    if not finite:
        raise FloatingPointError("the direction P is not finite: the statistics are degenerate beyond any fallback")


class GrowthStrategy(Strategy):
    """Functional-gradient growth: direction ``P``, step ``λ`` along ``P̂``, truncation to ``d_k + p``.

    Parameters
    ----------
    averaging : Averaging
        Batch-averaging formula (holds the inverse component).
    truncation : Truncation
        Truncated SVD, plain or metric-aware.
    line_search : LineSearch
        Path and search method for λ.
    spec : str
        Canonical spec string.
    """

    def __init__(self, averaging: Averaging, truncation: Truncation, line_search: LineSearch, spec: str) -> None:
        self.averaging = averaging
        self.truncation = truncation
        self.line_search = line_search
        self.spec = spec

    def new_statistics(self) -> Statistics:
        return self.averaging.new_statistics()

    def _direction(self, stats: Statistics, log: list[str], info: dict) -> Tensor:
        return self.averaging.direction(stats, log, info)

    def _step(self, ctx: StepContext, W_Q: Tensor, W_K: Tensor, stats: Statistics, p: int):
        rank = W_Q.shape[1] + p
        calls_before = ctx.loss.calls
        with timed(ctx.timings, "direction", ctx.X.device), torch.no_grad():
            prob = build_search_problem(self, stats, ctx, rank)
        ctx.timings.setdefault("line_search", 0.0)
        ctx.timings.setdefault("truncation", 0.0)
        if prob is None:
            ctx.log.append("direction: X P Xᵀ = 0 (G has no component any dZ can reach); λ = 0")
            with timed(ctx.timings, "truncation", ctx.X.device), torch.no_grad():
                U, s, V = self.truncation(ctx.Z, rank, None)
            lam = 0.0
        else:
            with timed(ctx.timings, "line_search", ctx.X.device):
                lam, loss_at = self.line_search.search(prob, ctx.log, ctx.info)
            U, s, V, lam, ctx.loss_after = self.line_search.finish(prob, lam, loss_at, ctx.log, ctx.info)
        # Every loss call hands its value to the host; so do the builder and the factorisations.
        ctx.info["host_syncs"] = ctx.info.get("host_syncs", 0) + ctx.loss.calls - calls_before
        root = s.clamp_min(0).sqrt() / math.sqrt(ctx.new_scale)
        return U * root, V * root, lam


def build_search_problem(
    strategy: GrowthStrategy, stats: Statistics, ctx: StepContext, rank: int
) -> SearchProblem | None:
    """Direction, normalisation, metric and truncation of one growth: the line search's problem.

    Builds ``P`` from the statistics, ``D = X P Xᵀ`` (masked) on the batch, ``P̂ = P / ‖D‖``
    and ``D̂ = D / ‖D‖``, the metric when the truncation asks for one, and the slope
    ``φ'(0) = −⟨G, D̂⟩``. Shared by the growth step and by measurements along λ.

    Parameters
    ----------
    strategy : GrowthStrategy
        Gives the averaging (direction) and the truncation.
    stats : Statistics
        Accumulated by ``strategy.new_statistics()``.
    ctx : StepContext
        The batch, the current ``Z`` and scores, the counted loss; ``ctx.log`` and
        ``ctx.info`` receive fallbacks and diagnostics (``host_syncs`` among them).
    rank : int
        ``d_k + p``.

    Returns
    -------
    SearchProblem or None
        None when ``X P Xᵀ = 0`` on the batch: no step can reach ``G``.
    """
    X, mask = ctx.X, ctx.mask
    P = strategy._direction(stats, ctx.log, ctx.info)
    metric = Metric(stats.mean_A, strategy.truncation.metric_rtol) if strategy.truncation.metric else None
    D = X @ P @ X.mT
    if mask is not None:
        D.mul_(mask)
    norm_t = torch.linalg.vector_norm(D)
    slope_t = -torch.dot(ctx.G.reshape(-1), D.reshape(-1))
    n_entries_t = mask.expand(X.shape[0], -1, -1).sum() if mask is not None else torch.tensor(D.numel())
    # One host transfer for the four numbers the step must decide on.
    finite, norm, slope, n_entries = torch.stack([
        torch.isfinite(P).all().to(D.dtype), norm_t, slope_t, n_entries_t.to(device=D.device, dtype=D.dtype),
    ]).tolist()
    ctx.info["host_syncs"] = ctx.info.get("host_syncs", 0) + 1 + ctx.info.pop("factor_host_syncs", 0)
    if metric is not None:
        ctx.log.extend(metric.log)
        ctx.info["host_syncs"] += metric.host_syncs
        if metric.null_dims:
            ctx.info["metric_null_directions"] = metric.null_dims
    _check_direction(bool(finite))
    if not (norm > 0 and math.isfinite(norm)):
        return None

    def truncate(Y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return strategy.truncation(Y, rank, metric)

    return SearchProblem(
        loss=ctx.loss, X=X, Z=ctx.Z, P_hat=P / norm, S0=ctx.S0, D_hat=D.div_(norm), loss0=ctx.loss0,
        truncate=truncate, lam_unit=math.sqrt(max(n_entries, 1.0)), slope0=slope / norm, timings=ctx.timings,
    )
