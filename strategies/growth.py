"""A growth strategy: averaging × inverse × truncation × line search, composed.

``Strategy`` holds what every strategy (including the baselines) shares: input
validation, statistics, the loss bookkeeping and the result record. ``GrowthStrategy``
is the functional-gradient growth of docs/mathematics.md §2–5.

Precision and range, the same for every strategy (``Strategy.grow``):

- float16/bfloat16 inputs are computed in float32, and inputs whose ``max|X|`` leaves
  float32's range (:data:`strategies._checks.X_RANGE`) in float64; the new factors are
  returned in the input's dtype. ``loss_of_scores`` still receives scores in the input's dtype (the
  rest of a half-precision model expects them); its value is widened to float32.
  ``loss_after`` is the loss at the factors as returned, i.e. after rounding.
- ``G`` far from 1 in magnitude (beyond ``2^±24``) is divided by a power of two first,
  which is exact: every direction is linear in ``G``, and the slope and first-order
  decrease are scaled back. ``P`` and ``X P Xᵀ`` are divided by a power of two near
  ``max|X P Xᵀ|`` (statistics the caller accumulated from an extreme ``G`` are not
  rescaled). So neither ``‖X P Xᵀ‖²`` nor ``⟨G, X P Xᵀ⟩`` overflows or underflows float32,
  which used to end the growth at λ = 0 with the wrong reason "X P Xᵀ = 0".
- Statistics of another dtype or device than ``X`` are converted to ``X``'s compute
  dtype and device where they are used.
- Every tensor returned is detached. A ``loss_after`` that is not finite is recorded in
  ``fallback`` and flagged by :attr:`GrowthResult.loss_after_finite`.
- Degenerate inputs end in the zero step, recorded in ``fallback``: the old columns kept
  (rescaled to ``new_scale``) and ``p`` zero columns, so the block's function is unchanged
  (:func:`zero_step`). That is the case when ``X P Xᵀ = 0`` (``X = 0``, ``G = 0``), when a
  factorisation fails (``torch.linalg.LinAlgError``), and when the step's factors overflow
  the input's dtype (an ``X`` so small that a step of one logit needs factors beyond it).
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import partial

import torch
from torch import Tensor

from ._checks import (
    abs_max,
    check_batch,
    check_factors,
    check_float_tensor,
    check_loss_before,
    check_scale,
    finite_magnitudes,
    pow2_scale,
    range_dtype,
    refuse_non_finite,
)
from .averaging import Averaging, Direction, Rotated
from .line_search import LineSearch, SearchProblem, factor_scores, loss_at_factors
from .path_slope import truncated_path_slope
from .result import GrowthResult
from .score_change import SampleGrams, SketchedNorms, grams_pay, sketch_pays
from .scores_loss import CountedLoss
from .signal import signal_share, signal_share_whitened
from .statistics import Statistics
from .timing import Profile, section, synchronize, timed
from .truncation import Metric, Truncation

#: One statistics batch under ``+holdout``: the samples the direction is fitted to and those λ is chosen on
#: (slices: views of the batch, with no index to build).
FITTED_HALF, HELD_OUT_HALF = slice(0, None, 2), slice(1, None, 2)

#: ``max|G|`` outside this range is rescaled by a power of two before anything is computed from
#: ``G``: squares of ``2^±24``-sized numbers summed over a batch stay well inside float32's range.
G_RANGE = (2.0**-24, 2.0**24)


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
    Z_factors : (Tensor, Tensor) or None
        ``(c W_Q, W_K)``, ``(d_e, d_k)`` each, where known: what a metric whitens ``Z`` through.
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
    g_scale : float
        ``G`` here is the caller's ``G`` divided by ``g_scale`` (a power of two, 1 unless
        the caller's was extreme): quantities in units of ``G`` are multiplied back by it.
    heldout_samples : slice or None
        :data:`HELD_OUT_HALF` while a ``+holdout`` line search moves those samples of the one statistics
        batch and chooses λ on them, the direction coming from the others (None: every sample, see
        ``grow``; None again while the step refits).
    refit_stats : Statistics or None
        ``+holdout``: the statistics of every sample, the λ batch's included, whose direction
        the step takes at the λ chosen on held-out data (None: the step takes the searched one).
    x_max : float
        ``max|X|`` of the caller's batch (NaN where not measured).
    profile : Profile or None
        The growth's sections (:class:`strategies.timing.Profile`), ``info["profile"]`` at the end.
    inputs : tuple or None
        The caller's ``(X, G, mask)`` as passed (before any conversion): statistics recognise their last
        batch by these tensors' identity (:meth:`Statistics.is_last`).
    M_heldout : Tensor or None
        ``Σ X_bᵀ G_b X_b`` over ``heldout_samples``, where ``M_batch`` and the fitted half's statistics give it.
    norms : SampleGrams or SketchedNorms or None
        What every direction's ``‖X P Xᵀ‖`` on the batch is taken from, once one was: the probes of a sketch, or
        the per-sample Gram matrices (those ``refit_stats`` kept, :attr:`Statistics.sample_grams`, where they did).
    attention0 : Tensor or None
        The output at ``S0`` on every sample (``attend``'s), where the loss offers it and a search may move part of the
        batch (:class:`strategies.scores_loss.AttentionSplit`).
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
    g_scale: float = 1.0
    heldout_samples: slice | None = None
    refit_stats: Statistics | None = None
    x_max: float = math.nan
    profile: Profile | None = None
    inputs: tuple | None = None
    M_heldout: Tensor | None = None
    norms: SampleGrams | SketchedNorms | None = None
    attention0: Tensor | None = None
    Z_factors: tuple[Tensor, Tensor] | None = None


class Strategy(ABC):
    """Common interface: ``new_statistics``, ``direction``, ``grow``."""

    spec: str = ""
    #: Whether ``grow`` chooses λ on data the statistics did not see (a ``+holdout`` line search).
    holds_out: bool = False

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

    def _stats(self, ctx: StepContext, stats: Statistics | None) -> Statistics:
        X, G, mask = ctx.X, ctx.G, ctx.mask
        if stats is None:
            with section("statistics"):
                own = self.new_statistics()._add(X, G, mask)  # grow() has validated the batch
            _host_reads(ctx, own.host_reads)
            return own
        return stats  # a caller's, checked by its entry point (grow's inputs, path_statistics) before any work

    def _may_split_one_batch(self, stats: Statistics | None) -> bool:
        """Whether a growth given ``stats`` searches λ on half of one batch (``+holdout`` with no statistics, or
        with those of the λ batch alone): :meth:`GrowthStrategy._holdout_stats` splits the batch exactly then,
        unless the statistics turn out never to have seen the λ batch, or the batch has one sample."""
        return self.holds_out and (stats is None or stats.n_batches == 1)

    def _check_stats(self, stats: Statistics, d_e: int) -> None:
        """Refuse a caller's statistics this strategy cannot use: another kind, empty, without the half sums its own
        keep, or of another ``d_e``."""
        own = self.new_statistics()
        if type(stats) is not type(own):
            raise ValueError(
                f"stats of type {type(stats).__name__} do not fit {self.spec!r}: use this strategy's new_statistics()"
            )
        stats._require()
        if stats.sum_M_even is None and own.split_half:
            raise ValueError(f"stats keep no split-half sums (made with split_half=False), which {self.spec!r} needs: "
                             "use this strategy's new_statistics()")
        if stats.sum_A.shape[-1] != d_e:
            raise ValueError(f"stats have d_e={stats.sum_A.shape[-1]} but X has d_e={d_e}")

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
            ``(d_e, d_e)``, in the statistics' dtype: float32 for float16/bfloat16 batches,
            since ``P`` is a measurement whose range can exceed float16's, not a weight
            (float64 for a float32 batch beyond float32's range, see :func:`strategies._checks.range_dtype`).

        Raises
        ------
        ValueError
            Bad input, or statistics no factorisation can make a finite direction of.
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
        try:
            with torch.no_grad():
                P = self._direction(stats, [], {})
        except torch.linalg.LinAlgError as e:
            raise ValueError(f"{self.spec}: no direction from these statistics: {_first_line(e)}") from None
        if not bool(torch.isfinite(P).all()):
            raise ValueError(f"{self.spec}: the direction P is not finite: the statistics are degenerate beyond any "
                             "fallback (batches of very different magnitudes?)")
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
        scores: Tensor | None = None,
        loss_before: float | Tensor | None = None,
    ) -> GrowthResult:
        """Grow ``d_k`` by ``p``.

        Parameters
        ----------
        W_Q, W_K : Tensor
            Current factors, ``(d_e, d_k)`` (``d_e`` includes the bias column, if any), of
            ``X``'s dtype and device.
        X : Tensor
            Inputs as the projections see them, ``(b, d_s, d_e)``; λ is chosen on this batch.
            float16 and bfloat16 are computed in float32 (see Notes).
        G : Tensor
            ``∂L/∂S`` on that batch, ``(b, d_s, d_s)``, of ``X``'s dtype. Any finite
            magnitude: an extreme one is rescaled exactly (a power of two) first.
        p : int
            New columns; ``d_k + p ≤ d_e``.
        loss_of_scores : callable
            Scores ``(b, d_s, d_s)`` -> scalar loss of the rest of the model on that batch.
            The scores always have ``X``'s dtype, also for half-precision inputs.
        scale : float, optional
            Current ``c`` (default ``1/sqrt(d_k)``).
        new_scale : float, optional
            ``c'`` after growth (default: ``scale``). The factors are built so that
            ``new_scale · W_Q' W_K'ᵀ = Z'``; pass ``1/sqrt(d_k + p)`` for the rescale policy.
        mask : Tensor, optional
            Bool ``(d_s, d_s)`` or ``(b, d_s, d_s)``, True where attended.
        stats : Statistics, optional
            Statistics from any number of batches; the direction comes from them
            instead of from ``(X, G)`` alone. Their dtype and device may differ from
            ``X``'s: the direction made from them is converted. A ``+holdout`` strategy
            chooses λ on data the direction did not see: when ``X`` is the last batch the
            statistics accumulated, it is taken out of them (:meth:`Statistics.without_last`);
            when they never saw ``X``, they are used whole; without statistics, or when ``X``
            is their only batch, the direction comes from the batch's samples of even index
            and λ from those of odd index (recorded in ``info["holdout"]``). In the first and
            the last case the step then refits: it takes the direction of every sample at the
            λ so chosen (docs/mathematics.md §5.4).
        scores : Tensor, optional
            The head's current scores ``scale · (X W_Q)(X W_K)ᵀ``, ``(b, d_s, d_s)`` of ``X``'s dtype, before the
            mask, where the caller has them (the forward pass whose backward gave ``G`` made them): they are then
            not formed again. Checked against the factors on the first sample.
        loss_before : float or Tensor, optional
            ``loss_of_scores`` at the current scores, where the caller has it: the previous growth's
            ``loss_after`` on the same batch (heads grown one after another), or the loss of the forward pass that
            gave ``G`` when ``loss_of_scores`` is that same loss. The growth then does not evaluate it (one loss
            call fewer), except where a ``+holdout`` search on one batch needs the output at the current scores
            from that call anyway (``info["loss_before"]`` says which). It is taken as given: another quantity (a
            loss with terms ``loss_of_scores`` lacks, another batch's) makes the search compare unlike numbers.

        Returns
        -------
        GrowthResult
            Detached tensors of ``X``'s dtype. ``loss_after`` is the loss at the factors
            as returned; if it is not finite, ``fallback`` says so and
            ``loss_after_finite`` is False.

        Raises
        ------
        ValueError
            Bad input (a tensor of another dtype or device, on the meta device, a complex or
            integer one, ``max|X|`` beyond float64's range), a loss that is not a real scalar
            or not finite at the current scores, or (``+holdout``) statistics that hold ``X``
            as another batch than their last.

        Notes
        -----
        Half precision: every computation runs in float32 on the widened inputs, so the
        direction, λ and the factors before rounding are the float32 result of the same
        inputs; only the loss evaluations (in the caller's precision) and the final rounding
        differ. ``info["loss_after_float32"]`` keeps the step's loss before that rounding.

        Degenerate inputs (``X = 0``, ``G = 0``, an ``X`` too small for a step the dtype can
        hold, a factorisation that fails) give the zero step with the reason in ``fallback``:
        see :func:`zero_step`.
        """
        t_start = time.perf_counter()
        profile = Profile(getattr(X, "device", None))
        with profile.active():
            result, caller_stats = self._grow(W_Q, W_K, X, G, p, loss_of_scores, scale, new_scale, mask, stats,
                                               profile, scores, loss_before)
        # Statistics the caller accumulated were timed when they were built: count them in (the caller's, not the
        # part a +holdout step split off them, whose time is inside this call's).
        outside = 0.0 if caller_stats is None else caller_stats.elapsed
        if outside:
            profile.add("statistics", outside)
        result.timings["statistics"] = result.timings.get("statistics", 0.0) + outside
        result.timings["total"] = time.perf_counter() - t_start + outside
        result.info["profile"] = profile.as_info(result.timings["total"])
        return result

    def _grow(self, W_Q: Tensor, W_K: Tensor, X: Tensor, G: Tensor, p: int,
              loss_of_scores: Callable[[Tensor], Tensor], scale: float | None, new_scale: float | None,
              mask: Tensor | None, stats: Statistics | None, profile: Profile | None = None,
              scores: Tensor | None = None,
              loss_before: float | Tensor | None = None) -> tuple[GrowthResult, Statistics | None]:
        """:meth:`grow` inside its profile: the result (``timings`` without ``total``, ``statistics`` without the
        caller's) and the caller's statistics (None when the growth made its own)."""
        with section("inputs"):
            mask = check_batch(X, G, mask, values=False)  # NaN/Inf: start_step, with the magnitudes
            check_factors(W_Q, W_K, X.shape[-1], p)
            for name, W in (("W_Q", W_Q), ("W_K", W_K)):
                if W.dtype != X.dtype or W.device != X.device:
                    raise ValueError(f"{name} ({W.dtype}, {W.device}) must match X ({X.dtype}, {X.device})")
            if stats is not None:  # before the first loss call: a caller's mistake costs no work
                self._check_stats(stats, X.shape[-1])
            loss_before = check_loss_before(loss_before)
        out_dtype = X.dtype
        caller_stats = stats
        own_stats = stats is None
        # Only a search on half of one statistics batch moves part of it: the output at the current scores is kept
        # for that one.
        keep_attention = self._may_split_one_batch(stats)
        ctx, W_Q, W_K = start_step(W_Q, W_K, X, G, loss_of_scores, scale, new_scale, mask,
                                   keep_attention=keep_attention, scores=scores, loss_before=loss_before)
        ctx.profile, ctx.inputs = profile, (X, G, mask)
        stats = self._stats(ctx, stats)
        if ctx.heldout_samples is None:  # no search will move part of the batch: the output at S0 is not needed
            ctx.attention0 = None
        ctx.log[:0] = stats.log
        # Statistics made here were timed as they were made: the growth's own, and the part +holdout split off.
        made_here = (stats if ctx.refit_stats is None else ctx.refit_stats).elapsed if own_stats else 0.0
        ctx.timings["statistics"] = made_here + (stats.elapsed if ctx.heldout_samples is not None else 0.0)
        # The tokens behind the direction the step takes: every sample's where +holdout refits.
        tokens = (stats if ctx.refit_stats is None else ctx.refit_stats).tokens
        ctx.info["statistics_tokens"] = tokens
        ctx.info["tokens_per_d_e2"] = tokens / X.shape[-1] ** 2
        ctx.info["statistics_batches"] = 1 if own_stats else caller_stats.n_batches
        ctx.M_batch = _batch_gradient(ctx, stats, caller_stats)
        if ctx.heldout_samples is not None:  # stats are the fitted half's
            ctx.M_heldout = _heldout_gradient(ctx.M_batch, stats)
        try:
            W_Q2, W_K2, lam = self._step(ctx, W_Q, W_K, stats, p)
        except torch.linalg.LinAlgError as e:  # inputs in range can still defeat an eigensolver: keep the function
            W_Q2, W_K2, lam = zero_step(ctx, W_Q, W_K, p, f"{self.spec}: a factorisation failed ({_first_line(e)})")
            ctx.log.append(f"no step: the statistics could not be factorised into a direction; {_KEPT}")
        with section("finish"):
            _host_reads(ctx, 1)  # _fits
            if not _fits(out_dtype, W_Q2, W_K2):
                largest = float(torch.stack([W_Q2.abs().amax(), W_K2.abs().amax()]).amax())
                W_Q2, W_K2, lam = zero_step(
                    ctx, W_Q, W_K, p, f"step: the new factors (max |entry| {largest:.3g}) do not fit {out_dtype}")
                ctx.log.append(f"no step: the step's new columns are too large for {out_dtype} (X is too small for "
                               f"any step of one logit); {_KEPT}")
                if not _fits(out_dtype, W_Q2, W_K2):
                    raise ValueError(f"scale, new_scale: the current factors times sqrt(scale / new_scale) = "
                                     f"{math.sqrt(ctx.scale / ctx.new_scale):.3g} do not fit {out_dtype}")
            result = finish_step(ctx, W_Q2, W_K2, lam, out_dtype, self.spec)
        # Every loss call hands its value to the host (the search decides on it), as do the reads counted on the way.
        _host_reads(ctx, 2 + ctx.loss.calls)  # + the finiteness checks of W_Q and W_K (X's and G's: the magnitudes)
        return result, (None if own_stats else caller_stats)


def start_step(
    W_Q: Tensor, W_K: Tensor, X: Tensor, G: Tensor, loss_of_scores: Callable[[Tensor], Tensor],
    scale: float | None, new_scale: float | None, mask: Tensor | None, keep_attention: bool = False,
    scores: Tensor | None = None, loss_before: float | None = None,
) -> tuple[StepContext, Tensor, Tensor]:
    """The step context of one growth: inputs in the compute dtype, ``G`` in range, current scores and loss.

    Parameters
    ----------
    W_Q, W_K : Tensor
        Current factors ``(d_e, d_k)``, already checked against ``X``.
    X, G : Tensor
        The batch ``(b, d_s, d_e)`` and ``∂L/∂S`` ``(b, d_s, d_s)``, already checked.
    loss_of_scores : callable
        The caller's loss; counted and cast back to the caller's dtype.
    scale, new_scale : float or None
        ``c`` (default ``1/sqrt(d_k)``) and ``c'`` (default ``c``).
    mask : Tensor or None
        The checked mask.
    keep_attention : bool
        Keep the output at the current scores (``ctx.attention0``) where the loss offers it
        (:class:`strategies.scores_loss.AttentionSplit`): for a search that will move part of the batch.
    scores : Tensor or None
        The caller's current scores ``(b, d_s, d_s)`` (see ``grow``), or None to form them.
    loss_before : float or None
        The caller's loss at the current scores (see ``grow``, checked by
        :func:`~strategies._checks.check_loss_before`), or None to evaluate it.

    Returns
    -------
    (StepContext, Tensor, Tensor)
        The context and ``W_Q``, ``W_K`` detached in the compute dtype.

    Raises
    ------
    ValueError
        A scale that is not finite and positive, ``max|X|`` beyond float64's range, current scores
        that overflow the inputs' dtype, ``scores`` that are not those of the factors, or a loss that is not
        finite at the current scores.
    """
    d_k = W_Q.shape[1]
    scale = check_scale("scale", 1.0 / math.sqrt(max(d_k, 1)) if scale is None else scale)
    new_scale = check_scale("new_scale", scale if new_scale is None else new_scale)
    out_dtype = X.dtype
    with section("inputs"):
        # One pass over each and one host transfer: the NaN/Inf check and both magnitudes (X's picks the compute
        # dtype, G's its rescaling).
        x_max, g_max = finite_magnitudes({"X": X, "G": G})
        cdt = range_dtype(X, x_max)
        # The loss sees scores in the caller's dtype whatever the compute dtype: a half-precision
        # model's rest (values, projections) cannot take float32 scores.
        loss = CountedLoss(loss_of_scores, out_dtype)
        # Detached: the inputs are data here, and a result must never carry the caller's graph.
        X, G, W_Q, W_K = (t.detach().to(cdt) for t in (X, G, W_Q, W_K))
        g_scale = 1.0
        if g_max > 0 and not (G_RANGE[0] <= g_max <= G_RANGE[1]):
            g_scale = float(pow2_scale(G))
            G = G / g_scale  # exact: a power of two
    with torch.no_grad():
        with section("current scores"):
            scaled_W_Q = scale * W_Q
            Z = scaled_W_Q @ W_K.mT
            S0 = current_scores(X, W_Q, W_K, scale) if scores is None else _given_scores(scores, X, W_Q, W_K, scale)
        attention0, given = None, None
        if keep_attention and loss.splits:
            loss0_t, attention0 = loss.attention(S0)
            loss0 = float(loss0_t)
            if loss_before is not None:
                given = "given, not used: the search on half the batch evaluated it with the output it keeps"
        elif loss_before is not None:
            loss0, given = loss_before, "given"
        else:
            loss0 = float(loss(S0))
    if not math.isfinite(loss0):
        if scores is not None:
            refuse_non_finite("scores", scores)
        s_max = float(S0.abs().amax())
        if not s_max <= torch.finfo(out_dtype).max:
            raise ValueError(f"X, W_Q, W_K: the current scores reach {s_max:.3g}, beyond {out_dtype}: rescale the "
                             "inputs or the factors")
        raise ValueError(f"loss_of_scores returned {loss0} at the current scores: cannot measure a decrease")
    ctx = StepContext(X=X, G=G, mask=mask, loss=loss, Z=Z, S0=S0, loss0=loss0, scale=scale, new_scale=new_scale,
                      g_scale=g_scale, x_max=x_max, attention0=attention0, Z_factors=(scaled_W_Q, W_K))
    _host_reads(ctx, 1 if scores is None else 2)  # the magnitudes, the given scores' check (loss calls: at the end)
    if g_scale != 1.0:
        ctx.info["g_scale"] = g_scale
    if given is not None:
        ctx.info["loss_before"] = given
    return ctx, W_Q, W_K


def current_scores(X: Tensor, W_Q: Tensor, W_K: Tensor, scale: float) -> Tensor:
    """A head's scores ``scale · (X W_Q)(X W_K)ᵀ``, ``(b, d_s, d_s)``, as a growth forms them.

    Parameters
    ----------
    X : Tensor
        ``(b, d_s, d_e)``.
    W_Q, W_K : Tensor
        ``(d_e, d_k)`` each.
    scale : float
        ``c``.
    """
    return factor_scores(X, scale * W_Q, W_K)


#: How far the caller's scores may lie from those the growth forms, relative to their largest entry: far above the
#: rounding of another order of the same products, far below a mistaken tensor's (another head's, a transposed or
#: softmaxed one).
SCORES_RTOL = 1e-3


def _given_scores(scores: Tensor, X: Tensor, W_Q: Tensor, W_K: Tensor, scale: float) -> Tensor:
    """The caller's current scores in the compute dtype of ``X``, once their first sample matches the factors'."""
    check_float_tensor("scores", scores)
    if scores.shape != (X.shape[0], X.shape[1], X.shape[1]):
        raise ValueError(f"scores must have shape (b, d_s, d_s) = {(X.shape[0], X.shape[1], X.shape[1])}, got "
                         f"{tuple(scores.shape)}")
    if scores.device != X.device:
        raise ValueError(f"scores are on {scores.device} but X is on {X.device}")
    S0 = scores.detach().to(X.dtype)
    formed = current_scores(X[:1], W_Q, W_K, scale)
    largest, gap = torch.stack([abs_max(formed), abs_max(S0[:1] - formed)]).tolist()  # one host read
    tol = max(SCORES_RTOL, 64 * torch.finfo(scores.dtype).eps) * largest
    if not gap <= tol:
        raise ValueError(f"scores: the first sample's differ from scale · (X W_Q)(X W_K)ᵀ by {gap:.3g} (more than "
                         f"{tol:.3g}): pass the head's scores before the mask and the softmax, at these factors")
    return S0


def finish_step(ctx: StepContext, W_Q: Tensor, W_K: Tensor, lam: float, out_dtype: torch.dtype,
                spec: str) -> GrowthResult:
    """The result of a step: factors checked and rounded, ``dZ``, the loss after, the first-order decrease.

    Parameters
    ----------
    ctx : StepContext
        The step's context, after the step.
    W_Q, W_K : Tensor
        The step's new factors ``(d_e, d_k + p)``, in the compute dtype.
    lam : float
        The step's λ.
    out_dtype : torch.dtype
        The caller's dtype.
    spec : str
        The strategy's spec, for the record and the messages.

    Returns
    -------
    GrowthResult
        Without ``timings["total"]``, which the caller sets.

    Raises
    ------
    FloatingPointError
        New factors that are not finite in ``out_dtype`` (``grow`` replaces such a step by :func:`zero_step` first).
    """
    X, G, log = ctx.X, ctx.G, ctx.log
    cdt = X.dtype
    if not _fits(out_dtype, W_Q, W_K):
        raise FloatingPointError(f"{spec}: the new factors are not finite in {out_dtype} (fallbacks: {log})")
    W_Q_out, W_K_out = W_Q.detach().to(out_dtype), W_K.detach().to(out_dtype)
    if out_dtype != cdt:
        # Report what the caller gets: the loss and dZ of the rounded factors.
        if ctx.loss_after is not None:
            ctx.info[f"loss_after_{str(cdt).removeprefix('torch.')}"] = ctx.loss_after
        W_Q, W_K, ctx.loss_after = W_Q_out.to(cdt), W_K_out.to(cdt), None
    with torch.no_grad():
        dZ = ctx.new_scale * W_Q @ W_K.mT - ctx.Z
        if ctx.loss_after is not None:
            loss_after = ctx.loss_after
        else:
            loss_after = float(loss_at_factors(ctx.loss.at_factors, X, ctx.new_scale * W_Q, W_K))
        # -<G, X dZ Xᵀ> = -<Σ_b X_bᵀ G_b X_b, dZ>: reuse the batch's own sum when the
        # statistics were built from it, else one pass over the batch.
        M = ctx.M_batch if ctx.M_batch is not None else _gradient_sum(X, G, ctx.mask)
        first_order = float(-(M * dZ).sum()) * ctx.g_scale
        _host_reads(ctx, 2)  # _fits above, the first-order decrease
    if not math.isfinite(loss_after):
        # Never a silent NaN: the record says so, and GrowthResult.loss_after_finite is False.
        log.append(f"loss: loss_of_scores returned {loss_after} at the new factors (λ = {lam:.3g})")
    synchronize(X.device)
    return GrowthResult(
        W_Q=W_Q_out, W_K=W_K_out, dZ=dZ.detach().to(out_dtype), lam=float(lam), first_order_decrease=first_order,
        loss_before=ctx.loss0, loss_after=loss_after, n_loss_evals=ctx.loss.calls, fallback=log,
        timings=ctx.timings, spec=spec, info=ctx.info,
    )


def append_columns(ctx: StepContext, W_Q: Tensor, W_K: Tensor, new_Q: Tensor,
                   new_K: Tensor) -> tuple[Tensor, Tensor]:
    """The old factors rescaled by ``sqrt(c / c')``, so that ``c' W_Q' W_K'ᵀ`` keeps ``c W_Q W_Kᵀ`` on them, with
    ``new_Q`` and ``new_K`` ``(d_e, p)`` appended."""
    keep = math.sqrt(ctx.scale / ctx.new_scale)
    return torch.cat([W_Q * keep, new_Q], 1), torch.cat([W_K * keep, new_K], 1)


def zero_step(ctx: StepContext, W_Q: Tensor, W_K: Tensor, p: int, reason: str) -> tuple[Tensor, Tensor, float]:
    """The step that keeps the block's function: ``p`` zero columns appended, ``reason`` recorded.

    Parameters
    ----------
    ctx : StepContext
        The step's context; ``reason`` goes to ``ctx.log``, and a loss the step had evaluated is dropped.
    W_Q, W_K : Tensor
        The current factors ``(d_e, d_k)`` in the compute dtype.
    p : int
        New columns.
    reason : str
        Why no step is taken, for the record.

    Returns
    -------
    (Tensor, Tensor, float)
        The new factors (:func:`append_columns` with zero columns) and λ = 0.

    Notes
    -----
    Needs no factorisation, so it is the step left where one failed. It equals what λ = 0 gives
    through the truncation (zero singular values for the new columns), up to the basis of the old ones.
    """
    ctx.log.append(f"{reason}; λ = 0 (zero new columns, function kept)")
    ctx.loss_after = None
    for phase in ("direction", "line_search", "truncation"):
        ctx.timings.setdefault(phase, 0.0)
    zeros = W_Q.new_zeros(W_Q.shape[0], p)
    return (*append_columns(ctx, W_Q, W_K, zeros, zeros), 0.0)


def _host_reads(ctx: StepContext, n: int) -> None:
    """Count ``n`` points where the growth reads a number on the host (on a GPU, a synchronisation each) into
    ``info["host_syncs"]``; the profile's own synchronisations are not among them."""
    ctx.info["host_syncs"] = ctx.info.get("host_syncs", 0) + n


def _batch_gradient(ctx: StepContext, stats: Statistics, caller_stats: Statistics | None) -> Tensor | None:
    """``Σ_b X_bᵀ G_b X_b`` of the batch ``grow`` was given, ``(d_e, d_e)``, where statistics already hold it as
    :func:`finish_step` would compute it (the same sum of the same numbers, to the rounding of statistics that add
    it from its two halves' products, ``split_half``); None otherwise.

    That is the case for statistics the growth made of the batch alone (``+holdout``'s full ones included),
    and for the caller's statistics whose last update had the very tensors given to ``grow``
    (:meth:`Statistics.is_last`), in the dtype and on the device the growth computes in, with ``G`` not
    rescaled (their sums are of the caller's ``G``). Saves ``finish_step`` a pass of two products over the
    batch: about a third of a statistics update.
    """
    if caller_stats is None:
        own = stats if ctx.refit_stats is None else ctx.refit_stats  # every sample's, where +holdout split them
        return own.sum_M if ctx.heldout_samples is None or own is not stats else None
    M = caller_stats.last_batch_sum("sum_M")
    if (M is None or ctx.inputs is None or ctx.g_scale != 1.0 or M.dtype != ctx.X.dtype
            or M.device != ctx.X.device or not caller_stats.is_last(*ctx.inputs)):
        return None
    return M


def _gradient_sum(X: Tensor, G: Tensor, mask: Tensor | None) -> Tensor:
    """``Σ_b X_bᵀ G_b X_b``, ``(d_e, d_e)``, for ``X (b, d_s, d_e)`` and ``G (b, d_s, d_s)`` (zero outside ``mask``):
    one pass of two products over the batch."""
    Gm = G if mask is None else G.masked_fill(~mask, 0.0)
    return X.reshape(-1, X.shape[-1]).mT @ (Gm @ X).reshape(-1, X.shape[-1])


def _heldout_gradient(M_batch: Tensor | None, fitted: Statistics) -> Tensor | None:
    """``Σ X_bᵀ G_b X_b`` over the held-out half of the one statistics batch: the batch's sum less that of the
    fitted half (``fitted.sum_M``), in the same units; None where either is unknown or they differ in kind."""
    half = fitted.sum_M
    if M_batch is None or half is None or half.dtype != M_batch.dtype or half.device != M_batch.device:
        return None
    return M_batch - half


def _fits(dtype: torch.dtype, *tensors: Tensor) -> bool:
    """Whether every entry of ``tensors`` is finite in ``dtype`` (one host transfer)."""
    return bool(torch.stack([torch.isfinite(t.to(dtype)).all() for t in tensors]).all())


def _first_line(error: BaseException) -> str:
    """An exception as one line: its type and the first line of its message (torch's run to several)."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__.lstrip('_')}: {lines[0] if lines else ''}".rstrip(": ")


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
        self.holds_out = line_search.holdout

    def new_statistics(self) -> Statistics:
        stats = self.averaging.new_statistics()
        stats.keep_one_batch = self.holds_out  # the one-batch split and its score changes read them again
        # The half sums (a product of half the batch at every update) only where something reads them: a ridge's
        # strength, the split-half estimate of +shrink, and a one-batch +holdout split (its half's Σ M).
        stats.split_half = self.averaging.uses_half_sums or self.line_search.shrink or self.holds_out
        return stats

    def _stats(self, ctx: StepContext, stats: Statistics | None) -> Statistics:
        if not self.holds_out:
            return super()._stats(ctx, stats)
        with section("holdout split"):
            return self._holdout_stats(ctx, stats)

    def _holdout_stats(self, ctx: StepContext, stats: Statistics | None) -> Statistics:
        """``+holdout``'s statistics: those the direction is made from, with ``ctx.refit_stats`` and
        ``ctx.heldout_samples`` set where the step refits (docs/mathematics.md §5.4)."""
        if stats is not None:
            stats = super()._stats(ctx, stats)
            # The very tensors of the last update need no fingerprint (a pass over the batch) to be found.
            where = stats.n_batches - 1 if ctx.inputs is not None and stats.is_last(*ctx.inputs) else None
            if where is None:
                _host_reads(ctx, 1)
                where = stats.batch_index(ctx.X)
            if where is None:
                ctx.info["holdout"] = "the statistics never saw the λ batch"
                return stats
            if where != stats.n_batches - 1:
                raise ValueError(
                    f"{self.spec}: the λ batch (X) is batch {where + 1} of the {stats.n_batches} in the statistics; a "
                    "+holdout strategy can take out only the last one: accumulate it last, or leave it out")
            if not self._may_split_one_batch(stats):
                ctx.info["holdout"] = "the λ batch taken out of the statistics; the step refits on every batch"
                ctx.refit_stats = stats
                return stats.without_last()
        # One batch: the direction from its samples of even index, λ from those of odd index.
        b = ctx.X.shape[0]
        if b < 2:
            ctx.log.append("holdout: one sample only; λ chosen on the sample the direction was fitted to")
            return super()._stats(ctx, None)
        even = FITTED_HALF
        mask = ctx.mask if ctx.mask is None or ctx.mask.dim() == 2 else ctx.mask[even]
        ctx.heldout_samples = HELD_OUT_HALF
        ctx.info["holdout"] = ("the direction from the batch's samples of even index, λ from those of odd index; "
                               "the step refits on every sample")
        ctx.log.append("holdout: one statistics batch: λ chosen on its odd samples with the direction of its even "
                       "ones, then refit on all (with 2 batches or more, λ is chosen on a whole batch)")
        ctx.refit_stats = super()._stats(ctx, stats)
        # The batch's sums are of the caller's G: derived from them, the half needs that G, not a rescaled one.
        half = ctx.refit_stats.even_half(ctx.X, ctx.G, ctx.mask) if ctx.g_scale == 1.0 else None
        if half is None:  # statistics no caller sees: no fingerprint, since no batch is ever looked up in them
            half = self.new_statistics()._add(ctx.X[even], ctx.G[even], mask, fingerprint=False)
            _host_reads(ctx, half.host_reads)
        return half

    def _direction(self, stats: Statistics, log: list[str], info: dict) -> Tensor:
        return self.averaging.direction(stats, log, info)

    def _finish(self, ctx: StepContext, prob: SearchProblem, lam: float, loss_at: float):
        """The line search's finishing step at ``lam``, with the whole batch's loss there: ``(U, s, V, λ, loss)``."""
        with section("line search"):
            U, s, V, lam, loss_after = self.line_search.finish(prob, lam, loss_at, ctx.log, ctx.info)
        if lam > 0 and (ctx.heldout_samples is not None or loss_after is None or not math.isfinite(loss_after)):
            # The search moved part of the batch, or judged another direction: the whole batch's loss at the step.
            with torch.no_grad():
                loss_after = float(loss_at_factors(ctx.loss.at_factors, ctx.X, U * s, V))
        return U, s, V, lam, loss_after

    def _refit(self, ctx: StepContext, rank: int) -> SearchProblem | None:
        """``+holdout``'s refit: the problem of the direction of every sample on the whole batch, to be stepped at
        the λ chosen with the held-out direction (λ is in the same units: RMS logits on the batch)."""
        ctx.info["refit"] = True
        ctx.heldout_samples = None
        prefixed = ctx.profile.prefixed("refit: ") if ctx.profile is not None else nullcontext()
        with timed(ctx.timings, "direction", ctx.X.device), torch.no_grad(), prefixed:
            return build_search_problem(self, ctx.refit_stats, ctx, rank, penalise=False)

    def path_statistics(self, ctx: StepContext, stats: Statistics | None) -> Statistics:
        """The statistics whose direction the step moves along: those of :meth:`grow`'s step (every sample's
        under ``+holdout``, which refits), for measurements along the path."""
        if stats is not None:
            self._check_stats(stats, ctx.X.shape[-1])
        stats = self._stats(ctx, stats)  # sets ctx.refit_stats where the step refits
        if ctx.refit_stats is None:
            return stats
        ctx.heldout_samples = None
        return ctx.refit_stats

    def _step(self, ctx: StepContext, W_Q: Tensor, W_K: Tensor, stats: Statistics, p: int):
        held_out = ("half" if ctx.heldout_samples is not None
                    else "batch" if self.holds_out and "holdout" in ctx.info else "")
        W_Q2, W_K2, lam, why = self._take_step(ctx, W_Q, W_K, stats, p)
        if lam == 0:
            ctx.log.append(_why_no_step(why, held_out, ctx))
        return W_Q2, W_K2, lam

    def _take_step(self, ctx: StepContext, W_Q: Tensor, W_K: Tensor, stats: Statistics, p: int):
        """:meth:`_step`, and where a λ = 0 comes from: ``"inputs"``, ``"direction"`` or ``"search"``."""
        if ctx.x_max == 0:  # no factorisation of all-zero statistics can say more, and some would only say it noisily
            return *zero_step(ctx, W_Q, W_K, p, "direction: X = 0, so no change of Z moves the scores"), "inputs"
        rank = W_Q.shape[1] + p
        with timed(ctx.timings, "direction", ctx.X.device), torch.no_grad():
            prob = build_search_problem(self, stats, ctx, rank)
        ctx.timings.setdefault("line_search", 0.0)
        ctx.timings.setdefault("truncation", 0.0)
        lam, loss_at, searched = 0.0, math.nan, None
        if prob is not None:
            with timed(ctx.timings, "line_search", ctx.X.device), section("line search"):
                lam, loss_at = self.line_search.search(prob, ctx.log, ctx.info)
            if ctx.refit_stats is not None and lam > 0:
                searched = (prob, lam, loss_at, ctx.heldout_samples)
                prob, loss_at = self._refit(ctx, rank), math.nan
        if prob is None:  # the builder has logged why (for the refit direction too)
            with timed(ctx.timings, "truncation", ctx.X.device), torch.no_grad():
                U, s, V = self.truncation(ctx.Z, rank, None)
            lam = 0.0
        else:
            U, s, V, lam, ctx.loss_after = self._finish(ctx, prob, lam, loss_at)
            if searched is not None and lam > 0 and not ctx.loss_after < ctx.loss0:
                ctx.log.append("holdout: the refit direction at the held-out λ does not lower the batch's loss; the "
                               "step takes the searched direction")
                ctx.info["refit"] = False
                prob, lam, loss_at, ctx.heldout_samples = searched
                U, s, V, lam, ctx.loss_after = self._finish(ctx, prob, lam, loss_at)
        root = s.clamp_min(0).sqrt() / math.sqrt(ctx.new_scale)
        return U * root, V * root, lam, ("direction" if prob is None else "search")


#: How every ``no step:`` line ends: what the block is left as (λ = 0 truncates ``Z`` itself, whose rank fits: the
#: same function up to rounding; the zero step's columns are exactly zero).
_KEPT = "the block computes what it did before"


def _why_no_step(why: str, held_out: str, ctx: StepContext) -> str:
    """The line that says, in a user's words, why a growth took no step (λ = 0; the lines before it say how).

    ``why`` is where λ = 0 came from (:meth:`GrowthStrategy._take_step`); ``held_out`` whether λ was searched on
    half of the one statistics batch (``"half"``), on a batch the direction did not see (``"batch"``) or on the
    direction's own data (``""``)."""
    kept = _KEPT
    if why == "inputs":
        return f"no step: the inputs X are all zero, so no new query/key columns can change the scores; {kept}"
    if why == "direction":
        return (f"no step: from these statistics no change of the query/key product can lower the loss "
                f"(see the line above); {kept}")
    last = ctx.log[-1] if ctx.log else ""
    if last.startswith("damp:"):
        return f"no step: the damped share of the step found does not lower the batch's loss; {kept}"
    if "all optimism" in last or (ctx.info.get("signal_share", 1.0) <= 0 and "not a descent" in last):
        return (f"no step: the split-half estimate finds no signal in the direction's decrease on its own samples "
                f"(signal share {ctx.info.get('signal_share', math.nan):.2g}); more statistics batches may; {kept}")
    if held_out == "half":
        return ("no step: along the direction of half the one statistics batch, no step lowers the loss of its "
                f"other half, so the direction does not generalise from it; accumulate more batches; {kept}")
    if held_out == "batch":
        return ("no step: along the direction of the statistics, no step lowers the loss of the batch it did not "
                f"see, so it does not generalise from them; accumulate more batches; {kept}")
    return f"no step: no step along the direction lowers this batch's loss; {kept}"


def build_search_problem(
    strategy: GrowthStrategy, stats: Statistics, ctx: StepContext, rank: int, penalise: bool = True
) -> SearchProblem | None:
    """Direction, normalisation, metric and truncation of one growth: the line search's problem.

    Builds ``P`` from the statistics, ``D = X P Xᵀ`` (masked) on the batch, ``P̂ = P / ‖D‖``
    and ``D̂ = D / ‖D‖``, the metric when the truncation asks for one, and the slope
    ``φ'(0) = −⟨G, D̂⟩``. Shared by the growth step and by measurements along λ.

    Where ``ctx.heldout_samples`` is set (one-batch ``+holdout``), the search moves those samples only: the
    problem's ``X``, ``S0`` and ``D̂`` hold them alone, its loss puts their scores among the other samples'
    current ones, and the slope is theirs; ``‖D‖``, and so the unit of λ, is the whole batch's.

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
    penalise : bool
        Whether a ``+shrink`` line search's optimism penalty is estimated (not for a problem that is
        only stepped along, as ``+holdout``'s refit).

    Returns
    -------
    SearchProblem or None
        None, with the reason appended to ``ctx.log``, when ``X P Xᵀ = 0`` on the batch (no
        step can reach ``G``), when it overflows ``X``'s dtype, or when ``P`` is not finite.

    Notes
    -----
    ``P`` and ``D`` are divided by a power of two near ``max|D|`` (exact) so that the norm
    and the slope neither overflow nor underflow; the slope is in units of the caller's
    ``G`` (``ctx.G · ctx.g_scale``).
    """
    # The section "score change" holds what the builder does besides the parts with sections of their own (the
    # ridge's strength, the direction's solves, the metric, the split-half estimate): chiefly X P Xᵀ.
    with section("score change"):
        return _build_search_problem(strategy, stats, ctx, rank, penalise)


def _build_search_problem(strategy: GrowthStrategy, stats: Statistics, ctx: StepContext, rank: int,
                          penalise: bool) -> SearchProblem | None:
    """:func:`build_search_problem`'s body."""
    X, mask = ctx.X, ctx.mask
    # Statistics may hold another dtype or device than the batch (accumulated in float64, or
    # on another device): the direction and the metric are used with X, so they follow it.
    shrink = strategy.line_search.shrink and penalise
    direction = strategy.averaging.direction_and_halves(stats, ctx.log, ctx.info, split=shrink)
    P, rotated = direction.P.to(dtype=X.dtype, device=X.device), direction.rotated
    with section("metric"):
        metric = _metric(strategy.truncation, stats, rotated, X)
    finite_t = torch.isfinite(P).all()
    # λ is in RMS logits per entry of the whole batch, for the searched direction and the refit alike; a +holdout
    # search on part of the batch moves, and sees the slope of, that part only. (Measured on the held-out half
    # instead, the step kept a quarter less of the held-out gain on MiniLM heads the sweep never grows: a direction
    # fitted to few samples acts mostly on those, docs/mathematics.md §5.4.)
    moved = ctx.heldout_samples if ctx.heldout_samples is not None else slice(None)  # a view: nothing is copied
    n_entries_t = (mask.expand(X.shape[0], -1, -1).sum() if mask is not None
                   else torch.tensor(X.shape[0] * X.shape[1] ** 2))
    numbers = _numbers_from_sums(ctx, P, finite_t, n_entries_t) or _numbers_from_scores(ctx, P, moved, finite_t,
                                                                                         n_entries_t)
    P, D_moved, (finite, norm, slope, n_entries), unit = numbers
    ctx.info["host_syncs"] = ctx.info.get("host_syncs", 0) + ctx.info.pop("factor_host_syncs", 0)
    if metric is not None:
        ctx.log.extend(metric.log)
        ctx.info["host_syncs"] += metric.host_syncs
        if metric.null_dims:
            ctx.info["metric_null_directions"] = metric.null_dims
    if not finite:  # statistics the caller accumulated from batches of far different magnitudes, say
        ctx.log.append("direction: P is not finite (the statistics are degenerate beyond any fallback); λ = 0")
        return None
    if not math.isfinite(norm):
        # Not "no reachable component": the inputs are too large for the dtype at any step size.
        ctx.log.append(f"direction: X P Xᵀ overflows {X.dtype} (|X| up to {float(X.abs().amax()):.3g}); λ = 0")
        return None
    if not norm > 0:
        ctx.log.append("direction: X P Xᵀ = 0 (G has no component any dZ can reach); λ = 0")
        return None
    slope = slope / norm * ctx.g_scale
    # The split-half estimate and the search's path both whiten the direction: once, here (entrywise where the
    # metric shares the ridge's eigenbasis).
    P_whitened = None
    if metric is not None and rotated is not None:  # made from the ridge's eigh (_metric)
        with section("metric"):
            P_whitened = metric.whiten_rotated(rotated.D.to(dtype=X.dtype, device=X.device)).div_(unit)
    elif shrink and direction.halves is not None and metric is not None:
        with section("split-half estimate"):
            P_whitened = metric.whiten(P)
    penalty = _optimism(strategy, stats, direction, rank, metric, slope, ctx, P_whitened) if shrink else 0.0
    loss, S0 = ctx.loss, ctx.S0
    held = ctx.heldout_samples
    if held is not None:
        S0, loss = ctx.S0[held], _held_out_loss(ctx, held)
    loss_of_factors = _loss_of_factors(ctx, held)

    def truncate(Y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return strategy.truncation(Y, rank, metric)

    # X contiguous: every trial's scores take the moved samples' X in one product (factor_scores).
    X_moved, P_hat = X[moved].contiguous(), P / norm
    mask_moved = mask if mask is None or mask.dim() == 2 else mask[moved]
    P_w_hat = None if P_whitened is None else P_whitened / norm
    if P_w_hat is None and metric is not None:
        # The path's slope and the trials' truncation both read the whitened direction: one (d_e, d_e) whitening,
        # two products of d_e³, not one each (every problem is stepped along, so it is never made in vain).
        with section("metric"):
            P_w_hat = metric.whiten(P_hat)

    def path_slope() -> float:
        """The truncated path's slope at λ = 0⁺ with the penalty, for a search that models the normal path."""
        gradient = ctx.M_batch if held is None else ctx.M_heldout
        if gradient is None:  # statistics not of this batch alone: one pass over the moved samples
            gradient = _gradient_sum(X_moved, ctx.G[moved], mask_moved)
        factors = ctx.Z_factors if ctx.Z_factors is not None else (ctx.Z, torch.eye(*ctx.Z.shape, dtype=ctx.Z.dtype,
                                                                                      device=ctx.Z.device))
        slope_t = truncated_path_slope(gradient.to(dtype=X.dtype, device=X.device), P_hat, factors, rank,
                                       strategy.truncation, metric, P_w_hat)
        _host_reads(ctx, 2)  # Z's rank, the slope
        path = float(slope_t) * ctx.g_scale
        ctx.info["path_slope_share"] = path / slope if slope else math.nan
        return path + penalty if math.isfinite(path) else math.nan
    return SearchProblem(
        loss=loss, X=X_moved, Z=ctx.Z, P_hat=P_hat, S0=S0,
        D_hat=D_moved.div_(norm) if D_moved is not None else lambda: _masked(X_moved @ P_hat @ X_moved.mT, mask_moved),
        loss0=ctx.loss0, truncate=truncate, lam_unit=math.sqrt(max(n_entries, 1.0)), slope0=slope + penalty,
        timings=ctx.timings, penalty=penalty,
        along=strategy.truncation.along(ctx.Z, P_hat, rank, metric, Z_factors=ctx.Z_factors, P_whitened=P_w_hat),
        path_slope0=path_slope, loss_of_factors=loss_of_factors,
    )


def _held_out_loss(ctx: StepContext, held: slice) -> Callable[[Tensor], Tensor]:
    """The batch's loss as a function of the scores of the samples ``held`` alone, the others at their current ones.

    Through the loss's attention split where it offers one (``ctx.attention0``): each call then computes the
    softmax and the product of those samples only. Otherwise their scores are written among the others'.
    """
    if ctx.attention0 is not None:
        return partial(ctx.loss.with_samples, ctx.attention0, held)

    def loss(S: Tensor) -> Tensor:
        with section("trial scores"):
            whole = torch.empty_like(ctx.S0)  # the two halves interleave: each written once
            whole[FITTED_HALF] = ctx.S0[FITTED_HALF]
            whole[held] = S  # differentiable in S (the Newton search's derivatives along λ)
        return ctx.loss(whole)

    return loss


def _loss_of_factors(ctx: StepContext, held: slice | None) -> Callable[[Tensor, Tensor], Tensor] | None:
    """The search's loss of the moved samples' scores given as factors (:attr:`SearchProblem.loss_of_factors`):
    the whole batch's, or with the samples ``held`` moved the others' output kept (``ctx.attention0``)."""
    if not isinstance(ctx.loss, CountedLoss):  # a measurement's own context (harness.measure)
        return None
    if held is None:
        return ctx.loss.at_factors
    return partial(ctx.loss.with_sample_factors, ctx.attention0, held) if ctx.attention0 is not None else None


def _masked(scores: Tensor, mask: Tensor | None) -> Tensor:
    """``scores`` with the entries outside ``mask`` set to zero (in place)."""
    return scores if mask is None else scores.mul_(mask)


def _read(ctx: StepContext, finite_t: Tensor, norm_t: Tensor, slope_t: Tensor, n_entries_t: Tensor,
          *more: Tensor) -> list[float]:
    """One host transfer for the four numbers a step decides on: whether ``P`` is finite, ``‖X P Xᵀ‖``, the slope
    ``−⟨G, X P Xᵀ⟩`` over the moved samples and the number of attended entries (and any ``more``, after them)."""
    _host_reads(ctx, 1)
    dtype, device = norm_t.dtype, norm_t.device
    return torch.stack([finite_t.to(dtype), norm_t, slope_t.to(dtype), n_entries_t.to(device=device, dtype=dtype),
                        *(t.to(dtype) for t in more)]).tolist()


def _numbers_from_scores(ctx: StepContext, P: Tensor, moved: slice, finite_t: Tensor,
                         n_entries_t: Tensor) -> tuple[Tensor, Tensor, list[float], Tensor]:
    """``P`` divided by a power of two near ``max|X P Xᵀ|``, the moved samples' ``X P Xᵀ`` in that unit,
    :func:`_read`'s numbers, and that power of two, from the score change formed over the batch."""
    X, mask = ctx.X, ctx.mask
    D = _masked(X @ P @ X.mT, mask)
    # D has G's scale: ‖D‖² and ⟨G, D⟩ overflow or underflow float32 for an extreme one (from
    # statistics the caller accumulated). Dividing D and P by one power of two is exact and
    # leaves P̂ = P / ‖D‖, D̂ and the slope bit for bit unchanged: they are scale-free.
    s = pow2_scale(D)
    P, D = P / s, D.div_(s)
    D_moved = D[moved]
    slope_t = -torch.dot(ctx.G[moved].reshape(-1), D_moved.reshape(-1))
    return P, D_moved, _read(ctx, finite_t, torch.linalg.vector_norm(D), slope_t, n_entries_t), s


def _numbers_from_sums(ctx: StepContext, P: Tensor, finite_t: Tensor,
                       n_entries_t: Tensor) -> tuple[Tensor, None, list[float], Tensor] | None:
    """:func:`_numbers_from_scores` without forming ``X P Xᵀ`` (the moved samples' score change left to be formed
    if ever asked for), where that is cheaper and the sums allow it.

    ``‖X P Xᵀ‖`` comes from :func:`_score_change_norms` (kept on ``ctx`` for every direction of the growth): a
    seeded sketch where that costs at most half as much (:func:`strategies.score_change.sketch_pays`), whose
    relative standard error goes to ``info["norm_sketch_rel_se"]`` (the largest of the growth's directions), else
    the samples' Gram matrices. The slope is ``⟨G_b, X_b P X_bᵀ⟩ = ⟨X_bᵀ G_b X_b, P⟩`` summed over the moved
    samples (``ctx.M_batch``, or ``ctx.M_heldout`` for the held-out half). ``P`` is divided by a power of two near
    ``max|P|``. None where the batch is masked, ``d_e`` is too wide for the traces and the sketch does not pay,
    the moved samples' gradient sum is not known, or a number is out of range: the formed score change then
    decides, and says why.
    """
    gradient = ctx.M_batch if ctx.heldout_samples is None else ctx.M_heldout
    if gradient is None:
        return None
    if ctx.norms is None:
        ctx.norms = _score_change_norms(ctx)
        if ctx.norms is None:
            return None
    unit = pow2_scale(P)
    P = P / unit
    slope_t = -torch.sum(gradient * P)
    sketched = isinstance(ctx.norms, SketchedNorms)
    if sketched:
        norm_t, error_t = ctx.norms.score_change_norm(P, with_error=True)
        numbers = _read(ctx, finite_t, norm_t, slope_t, n_entries_t, error_t)
        numbers, error = numbers[:4], numbers[4]
    else:
        numbers = _read(ctx, finite_t, ctx.norms.score_change_norm(P), slope_t, n_entries_t)
    finite, norm, slope, _ = numbers
    if not (finite and math.isfinite(norm) and norm > 0 and math.isfinite(slope)):
        return None
    if sketched:  # recorded for the directions the unit came from
        ctx.info["norm_sketch_probes"] = ctx.norms.k * ctx.X.shape[0]
        ctx.info["norm_sketch_rel_se"] = max(error, ctx.info.get("norm_sketch_rel_se", 0.0))
    return P, None, numbers, unit


def _score_change_norms(ctx: StepContext) -> SampleGrams | SketchedNorms | None:
    """What the growth's ``‖X P Xᵀ‖`` are taken from without forming ``X P Xᵀ``: probes where a sketch pays (through
    the samples' Gram matrices where the statistics kept them), the samples' Gram matrices where the traces pay,
    else None (the score change is formed)."""
    # Statistics of every sample hold the one batch λ is chosen on (+holdout's split), and may have kept its
    # samples' Gram matrices.
    kept = ctx.refit_stats.sample_grams if ctx.refit_stats is not None else None
    if kept is not None:
        kept = kept.to(dtype=ctx.X.dtype, device=ctx.X.device)
    if sketch_pays(ctx.X, ctx.mask):
        return SketchedNorms(ctx.X, grams=kept)
    if not grams_pay(ctx.X, ctx.mask):
        return None
    return SampleGrams(ctx.X) if kept is None else SampleGrams(grams=kept)


def _metric(truncation: Truncation, stats: Statistics, rotated: Rotated | None, X: Tensor) -> Metric | None:
    """The truncation's metric of ``E[XᵀX]`` in ``X``'s dtype and device (None without ``+metric``): from the
    ridge's eigendecomposition of the same matrix where the direction came with one, else factorised afresh."""
    if not truncation.metric:
        return None
    if rotated is not None:
        return Metric.from_eigh(rotated.w.to(device=X.device), rotated.V.to(dtype=X.dtype, device=X.device),
                                truncation.metric_rtol)
    return Metric(stats.mean_A.to(dtype=X.dtype, device=X.device), truncation.metric_rtol)


def _optimism(strategy: GrowthStrategy, stats: Statistics, direction: Direction, rank: int,
              metric: Metric | None, slope: float, ctx: StepContext, P_whitened: Tensor | None = None) -> float:
    """``κ = (1 − s) |φ'(0)|``: the in-sample slope's optimism, with ``s`` the split-half signal share of the
    direction on its truncation subspace (:func:`strategies.signal.signal_share`, clamped to [0, 1]);
    ``P_whitened`` is the direction in the metric, where the caller made it.

    A share that cannot be estimated (a formula that does not split, an in-sample slope that is not a descent)
    counts as no signal only in the second case; the first leaves λ unshrunk and says so in ``ctx.log``.
    """
    rotated = direction.rotated
    if direction.halves is None and (rotated is None or rotated.D_a is None):
        ctx.log.append(f"shrink: {strategy.averaging.name} cannot split its direction into halves; λ not shrunk")
        return 0.0
    with section("split-half estimate"):
        if direction.halves is not None:
            share = signal_share(stats.half_sums(), direction.halves, rank, metric, strategy.truncation.top_subspace,
                                 whitened_direction=P_whitened)
        else:
            share = _rotated_signal_share(rotated, rank, metric, strategy.truncation, ctx.X)
    ctx.info["signal_share"] = share
    ctx.info["host_syncs"] = ctx.info.get("host_syncs", 0) + 1
    kept = min(max(share, 0.0), 1.0) if math.isfinite(share) else 0.0
    penalty = (1.0 - kept) * abs(slope) if math.isfinite(slope) else 0.0
    ctx.info["optimism_penalty"] = penalty
    return penalty


def _rotated_signal_share(rotated: Rotated, rank: int, metric: Metric | None, truncation: Truncation,
                          X: Tensor) -> float:
    """The split-half share from the halves in the ridge's eigenbasis: whitened entrywise by a metric made in that
    basis (:func:`_metric`), or as they are for a plain truncation (the Frobenius geometry is the same in any
    orthonormal basis)."""
    device = X.device
    M_a, M_b = rotated.M_a.to(device=device), rotated.M_b.to(device=device)
    D, D_a = rotated.D.to(device=device), rotated.D_a.to(device=device)
    halves = (D_a, D - D_a)
    if metric is not None:
        M_a, M_b = metric.whiten_gradient_rotated(M_a), metric.whiten_gradient_rotated(M_b)
        halves = tuple(metric.whiten_rotated(half) for half in halves)
    return signal_share_whitened((M_a, M_b), halves, rank, truncation.top_subspace,
                                 dtype=metric.L.dtype if metric is not None else D.dtype)
