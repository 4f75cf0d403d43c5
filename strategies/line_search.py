"""Choosing the step λ along the normalised direction ``P̂`` (docs/mathematics.md §5).

- ``normal``: ``λ ↦ L( X T_r(Z − λP̂) Xᵀ )``, one truncation per trial;
- ``fast``: ``λ ↦ L( S − λ X P̂ Xᵀ )``, no rank constraint and no SVD per trial;
  the caller truncates once at the chosen λ.

Search methods: ``grid`` (0 and 16 geometric points), ``bounded`` (Brent's bounded
method of :func:`scipy.optimize.minimize_scalar`, on ``log λ``), ``newton`` (first and
second derivatives of the loss along the path by AD), ``quadratic`` (docs/mathematics.md §5: ``φ(0)``
and ``φ'(0) = −⟨G, X P̂ Xᵀ⟩`` cost nothing, one trial λ fixes a quadratic model; no AD),
``bracket`` (each trial placed by a local model of the loss along λ, expanding past the
trials while the best is at an end and under Brent's safeguards inside a bracket; it stops
when the model predicted its last trial and promises under 1% more: the path's best where
the loss along it is far from quadratic, in two to twelve evaluations).

Two flags judge λ by data the direction was not fitted to (docs/mathematics.md §5.4):
``holdout`` (the growth chooses λ on a batch its statistics did not see, see
:meth:`strategies.growth.GrowthStrategy.grow`) and ``shrink`` (every method minimises
``φ(λ) + κλ``, the loss with its in-sample optimism ``κλ`` added back, ``κ`` from the
split-half estimate of :mod:`strategies.signal`). A third, ``damp``, takes a fixed share
``damping`` of the λ found (boosting's learning rate, docs/mathematics.md §5.5).

``P̂`` is normalised so that ``‖X P̂ Xᵀ‖_F = 1`` over the batch: λ is the Frobenius norm
of the (untruncated) score change. Searches are bracketed in units of
``sqrt(#attended entries)``, i.e. of a root-mean-square change of one logit per entry.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field

import numpy as np
import torch
from scipy.optimize import minimize_scalar
from torch import Tensor

from ._checks import check_number
from .path_model import LocalModel
from .registry import register
from .timing import section, timed

METHODS = ("grid", "bounded", "newton", "quadratic", "bracket")
#: Half-width on ``log λ`` of the bracket search's resolution: it stops once λ is known to about ±5%.
LOG_TOL = 0.05
#: How far one bracket search trial may move past the trials made so far (a factor on λ, either way).
FIRST_JUMP = 10.0
#: A second trial closer than this (relative) to the first is moved three times as far: two trials that
#: close fit the loss's curvature from rounding.
SECOND_TRIAL_GAP = 0.1
#: Where such a second trial moves to, and the least step toward 0 while no trial has decreased the loss (on λ).
NUDGE = 1 + 3 * SECOND_TRIAL_GAP
#: Width on ``log λ`` of the bracket (between the best trial's neighbours) under which the bracket search may
#: stop on its model's word: λ known to within a factor of 4.
SETTLE_LOG_WIDTH = math.log(4.0)
GOLDEN_RATIO = (1 + math.sqrt(5)) / 2
#: The golden-section step, as a share of the larger side of the bracket.
GOLDEN_SECTION = (3 - math.sqrt(5)) / 2
#: The share of the chosen λ that ``+damp`` keeps unless ``damping`` says otherwise: boosting's usual learning
#: rates are 0.1 to 0.5 of a step fitted to many trees; one growth is one step, and half of it keeps most of a
#: quadratic path's decrease (three quarters) while halving what the fit to the batch's noise adds.
DAMPING = 0.5


@dataclass
class SearchProblem:
    """Everything a line search needs for one growth.

    Attributes
    ----------
    loss : callable
        Scores ``(b, d_s, d_s)`` -> scalar loss tensor (the counted ``loss_of_scores``).
    X : Tensor
        ``(b, d_s, d_e)``.
    Z, P_hat : Tensor
        Current product ``c W_Q W_Kᵀ`` and normalised direction, ``(d_e, d_e)``.
    S0 : Tensor
        ``X Z Xᵀ``, ``(b, d_s, d_s)``.
    D_hat : Tensor or callable
        ``X P̂ Xᵀ``, ``(b, d_s, d_s)``, or a function of no arguments that forms it: only the fast path and
        measurements along it need it, and a growth that found ``‖X P Xᵀ‖`` and the slope without it (from the
        samples' Gram matrices) leaves it unformed. Read it through :meth:`direction_scores`.
    loss0 : float
        ``loss(S0)``.
    truncate : callable
        ``Y (d_e, d_e) -> (U, s, V)``, the strategy's truncation at the grown rank.
    lam_unit : float
        ``sqrt(#attended entries)``: λ of one RMS logit per entry.
    slope0 : float
        ``−⟨G, X P̂ Xᵀ⟩``: the fast path's slope at λ = 0, from the captured gradient (with
        ``penalty`` already added).
    timings : dict, optional
        Where the finishing step adds its ``truncation`` and ``line_search`` seconds.
    penalty : float
        ``κ ≥ 0``: the searches minimise ``φ(λ) + κλ`` (``+shrink``); 0 otherwise.
    along : callable, optional
        ``λ -> T_r(Z − λP̂)`` as ``(U, s, V)``, cheaper than ``truncate`` on each step where the truncation can
        prepare the path once (:meth:`strategies.truncation.Truncation.along`). Read it through
        :meth:`step_factors`.
    path_slope0 : float or callable, optional
        The truncated path's slope at ``λ = 0⁺`` (with ``penalty`` added), or a function of no arguments that
        finds it (:func:`strategies.path_slope.truncated_path_slope`); NaN where unknown. Read it through
        :meth:`truncated_slope`.
    loss_of_factors : callable, optional
        ``loss``, the scores given as two factors ``L, R`` ``(b, d_s, r)`` with ``S = L Rᵀ``
        (:meth:`strategies.scores_loss.CountedLoss.at_factors`); None where only ``loss`` is offered. Read it
        through :meth:`loss_at_step`.
    """

    loss: Callable[[Tensor], Tensor]
    X: Tensor
    Z: Tensor
    P_hat: Tensor
    S0: Tensor
    D_hat: Tensor | Callable[[], Tensor]
    loss0: float
    truncate: Callable[[Tensor], tuple[Tensor, Tensor, Tensor]]
    lam_unit: float
    slope0: float = math.nan
    timings: dict[str, float] | None = None
    penalty: float = 0.0
    along: Callable[[Tensor | float], tuple[Tensor, Tensor, Tensor]] | None = None
    path_slope0: float | Callable[[], float] = math.nan
    loss_of_factors: Callable[[Tensor, Tensor], Tensor] | None = None
    _steps: dict[float, tuple[Tensor, Tensor, Tensor]] = field(default_factory=dict, init=False, repr=False)

    def direction_scores(self) -> Tensor:
        """``D̂ = X P̂ Xᵀ``, ``(b, d_s, d_s)``, formed on the first call where the problem holds how to form it."""
        if callable(self.D_hat):
            self.D_hat = self.D_hat()
        return self.D_hat

    def truncated_slope(self) -> float:
        """The normal path's slope at ``λ = 0⁺`` (penalty added), found on the first call where the problem holds
        how to find it; ``slope0`` where it holds neither."""
        if callable(self.path_slope0):
            self.path_slope0 = self.path_slope0()
        return self.path_slope0 if math.isfinite(self.path_slope0) else self.slope0

    def loss_at_step(self, U: Tensor, s: Tensor, V: Tensor) -> Tensor:
        """The loss at the scores ``X (U diag(s) Vᵀ) Xᵀ`` of a truncated step, ``U, V`` ``(d_e, r)``: through
        ``loss_of_factors`` where the problem holds it, which forms the scores a few samples at a time."""
        if self.loss_of_factors is None:
            return self.loss(truncated_scores(self.X, U, s, V))
        return loss_at_factors(self.loss_of_factors, self.X, U * s, V)

    def step_factors(self, lam: Tensor | float) -> tuple[Tensor, Tensor, Tensor]:
        """``T_r(Z − λP̂)`` as ``(U, s, V)``. A float λ's factors are kept: the search's finishing step truncates
        at one of its trials again, and finds them (the same factors, without a second SVD)."""
        kept = isinstance(lam, float)  # a tensor λ is differentiated through: its factors are not reused
        if kept and lam in self._steps:
            return self._steps[lam]
        factors = self.along(lam) if self.along is not None else self.truncate(self.Z - lam * self.P_hat)
        if kept:
            self._steps[lam] = factors
        return factors


class LineSearch(ABC):
    """A path ``λ ↦ scores`` and a method to minimise the loss along it.

    Parameters
    ----------
    method : {"grid", "bounded", "newton", "quadratic", "bracket"}
        Search method.
    n_grid : int
        Grid points including λ = 0 (17, the starting prototype's grid, docs/mathematics.md §5.2).
    lam_min, lam_max : float
        Bracket of the grid and of the bounded search, in RMS logits per entry.
    maxiter : int
        Iteration cap of the bounded search.
    newton_steps : int
        Newton iterations (each one AD pass); also the number of quadratic refits. The last one is followed by one
        quadratic interpolation through ``φ(0)``, ``φ'(0)`` and the loss at the Newton
        point (one more evaluation).
    max_backtrack : int
        Halvings of the step when neither point decreases the loss.
    max_trials : int
        Trials of the bracket search at most (before backtracking, when none decreased the loss).
    gain_tol : float
        The bracket search stops when its model promises less than this share of the decrease found so far
        (and predicted its last trial well, see ``trust_tol``).
    trust_tol : float
        The model's prediction of a trial counts as good when within this share of the decrease found so far.
    holdout : bool
        λ is chosen on a batch the statistics did not see (``+holdout``; the growth arranges the data).
    shrink : bool
        λ minimises the loss plus its in-sample optimism (``+shrink``; the growth sets ``penalty``).
    damp : bool
        The step taken is ``damping`` times the λ the method found (``+damp``).
    damping : float, optional
        The share of λ kept under ``+damp``, in (0, 1] (default :data:`DAMPING`); only with ``damp``.
    """

    name: str = ""
    #: The search methods this path takes (the part of a spec after ``:``).
    methods: tuple[str, ...] = METHODS
    #: Whether ``search``'s returned loss is the loss at the truncated step (no re-evaluation needed).
    loss_is_final: bool = False

    def __init__(
        self,
        method: str = "grid",
        n_grid: int = 17,
        lam_min: float = 1e-3,
        lam_max: float = 10.0,
        maxiter: int = 40,
        newton_steps: int = 1,
        max_backtrack: int = 8,
        max_trials: int = 12,
        gain_tol: float = 0.01,
        trust_tol: float = 0.05,
        holdout: bool = False,
        shrink: bool = False,
        damp: bool = False,
        damping: float | None = None,
    ) -> None:
        if method not in self.methods:
            raise ValueError(f"unknown search method {method!r}; valid: {', '.join(self.methods)}")
        for name, value in (("n_grid", n_grid), ("maxiter", maxiter), ("newton_steps", newton_steps),
                            ("max_backtrack", max_backtrack), ("max_trials", max_trials)):
            check_number(f"line search {name}", value, integer=True)
        for name, value in (("lam_min", lam_min), ("lam_max", lam_max), ("gain_tol", gain_tol),
                            ("trust_tol", trust_tol)):
            check_number(f"line search {name}", value)
        if n_grid < 2:
            raise ValueError(f"n_grid must be >= 2, got {n_grid}")
        if not (0 < lam_min < lam_max):
            raise ValueError(f"need 0 < lam_min < lam_max, got {lam_min}, {lam_max}")
        if newton_steps < 1 or maxiter < 1 or max_backtrack < 0 or max_trials < 2:
            raise ValueError("newton_steps and maxiter must be >= 1, max_trials >= 2, max_backtrack >= 0")
        if not (0 <= gain_tol < 1 and 0 <= trust_tol < 1):
            raise ValueError(f"need 0 <= gain_tol < 1 and 0 <= trust_tol < 1, got {gain_tol}, {trust_tol}")
        self.method = method
        self.n_grid = n_grid
        self.lam_min = lam_min
        self.lam_max = lam_max
        self.maxiter = maxiter
        self.newton_steps = newton_steps
        self.max_backtrack = max_backtrack
        self.max_trials = max_trials
        self.gain_tol = gain_tol
        self.trust_tol = trust_tol
        if damping is not None and not damp:
            raise ValueError("damping=... applies to a spec with +damp on its line search")
        damping = DAMPING if damping is None else damping
        if isinstance(damping, bool) or not isinstance(damping, int | float) or not 0 < damping <= 1:
            raise ValueError(f"damping must be a number in (0, 1], got {damping!r}")
        self.holdout = bool(holdout)
        self.shrink = bool(shrink)
        self.damp = bool(damp)
        self.damping = float(damping)

    @abstractmethod
    def scores(self, prob: SearchProblem, lam: Tensor | float) -> Tensor:
        """Scores ``(b, d_s, d_s)`` at step ``lam`` (differentiable in a tensor ``lam``)."""

    def model_slope(self, prob: SearchProblem) -> float:
        """``φ'(0)`` of this path, as the bracket search's model takes it: the fast path's ``slope0``."""
        return prob.slope0

    def loss_at(self, prob: SearchProblem, lam: float) -> Tensor:
        """The loss at the scores of step ``lam`` on this path."""
        return prob.loss(self.scores(prob, lam))

    def phi(self, prob: SearchProblem, lam: float) -> float:
        """The loss at ``lam`` plus ``prob.penalty · lam``; non-finite losses become ``+inf`` so a search steps
        away from them."""
        with torch.no_grad():
            v = float(self.loss_at(prob, lam))
        return v + prob.penalty * lam if math.isfinite(v) else math.inf

    def search(self, prob: SearchProblem, log: list[str], info: dict) -> tuple[float, float]:
        """Minimise the (penalised) loss along the path; return ``(λ, loss at λ)``, the loss without the penalty.

        λ = 0 (the current loss) is always a candidate, so the returned loss never
        exceeds ``prob.loss0`` along this path.
        """
        if self.method == "grid":
            lam, v = self._grid(prob)
        elif self.method == "bounded":
            lam, v = self._bounded(prob, info)
        elif self.method == "quadratic":
            lam, v = self._quadratic(prob, log, info)
        elif self.method == "bracket":
            lam, v = self._bracket(prob, log, info)
        else:
            lam, v = self._newton(prob, log, info)
        v -= prob.penalty * lam
        return self._damped(prob, lam, v, log, info) if self.damp and lam > 0 else (lam, v)

    def _damped(self, prob: SearchProblem, lam: float, loss_at: float, log: list[str],
                info: dict) -> tuple[float, float]:
        """``+damp``: ``(damping · λ, the loss there)``, one loss call more on a path whose loss is final (the
        fast path's :meth:`finish` evaluates the truncated step anyway); λ = 0 where that step does not decrease
        the loss (a path that is not convex between 0 and λ)."""
        info["lam_undamped"] = lam
        info["damping"] = self.damping
        if self.damping == 1.0:
            return lam, loss_at
        damped = self.damping * lam
        if not self.loss_is_final:
            return damped, math.nan
        with torch.no_grad():
            v = float(self.loss_at(prob, damped))
        if not v < prob.loss0:
            log.append(f"damp: the loss at {self.damping:g}·λ is not below the loss at λ = 0; λ = 0")
            return 0.0, prob.loss0
        return damped, v

    def finish(self, prob: SearchProblem, lam: float, loss_at: float, log: list[str],
               info: dict) -> tuple[Tensor, Tensor, Tensor, float, float | None]:
        """The truncated step at the chosen λ: ``(U, s, V, λ, loss after or None if not evaluated)``."""
        with _timed(prob, "truncation"), torch.no_grad():
            U, s, V = prob.step_factors(lam)
        return U, s, V, lam, (loss_at if lam > 0 else None)

    def _bracket(self, prob: SearchProblem, log: list[str], info: dict) -> tuple[float, float]:
        """Trials placed by a local model of the loss along λ, kept inside a shrinking bracket, until one more
        cannot pay (docs/mathematics.md §5.2).

        The first trial is ``λ_1`` of :meth:`_quadratic`; each next one is the minimiser of
        :class:`~strategies.path_model.LocalModel` fitted to the trials so far and to ``φ(0)``, ``φ'(0)``, moved
        at most a decade (:data:`FIRST_JUMP`) past the trials while the best one is at an end, and kept inside the
        bracket around the best trial once there is one, with a golden-section step where the model does not
        shrink it. The search stops when the model predicted the last trial to within ``trust_tol`` of the
        decrease and promises less than ``gain_tol`` of it (inside a bracket, once that is narrower than a factor
        of 4: :data:`SETTLE_LOG_WIDTH`), when the bracket is narrower than ±5% on λ (:data:`LOG_TOL`), or after
        ``max_trials``.
        """
        f0 = prob.loss0
        if not (math.isfinite(prob.slope0) and (prob.slope0 < 0 or prob.penalty > 0)):
            log.append(f"bracket: slope {prob.slope0:.3g} at λ=0 is not a descent; λ = 0")
            return 0.0, f0
        g0 = self.model_slope(prob)
        trials: dict[float, float] = {}
        if not g0 < 0:
            # +shrink's penalty can cancel the slope, and the truncation can flatten it, yet the path fall further
            # on: one trial tells, and its secant stands in for the slope.
            first = self.phi(prob, prob.lam_unit)
            if not first < f0:
                info["bracket_trials"] = 1
                log.append("bracket: the slope at λ=0 is no descent (the in-sample slope all optimism, or the "
                           "truncated path's flat) and one trial does not decrease the penalised loss; λ = 0")
                return 0.0, f0
            trials[prob.lam_unit] = first
            g0 = (first - f0) / prob.lam_unit
        inside: list[tuple[float, bool]] = []  # per trial placed inside the bracket: its width on log λ, golden?
        lam, predicted = (_first_trial(prob), math.nan) if not trials else self._next_trial(trials, f0, g0, False, [])
        while len(trials) < self.max_trials:
            trials[lam] = self.phi(prob, lam)
            decrease = f0 - min(trials.values())
            trusted = decrease > 0 and abs(trials[lam] - predicted) <= self.trust_tol * decrease
            step = self._next_trial(trials, f0, g0, trusted, inside)
            if step is None or step[0] in trials:  # a repeated trial would learn nothing: the model is done
                break
            lam, predicted = step
        info["bracket_trials"] = len(trials)
        best = min(trials, key=trials.get)
        return (best, trials[best]) if trials[best] < f0 else self._backtrack(prob, min(trials), log, "bracket")

    def _next_trial(self, trials: dict[float, float], f0: float, g0: float, trusted: bool,
                    inside: list[tuple[float, bool]]) -> tuple[float, float] | None:
        """``(λ, predicted φ)`` of the bracket search's next trial, or None when it should stop.

        ``trusted``: the model fitted before the last trial predicted it; ``inside``: per trial placed inside
        the bracket so far, the bracket's width on ``log λ`` then and whether it was a golden-section step.
        """
        model = LocalModel(trials, f0, g0)
        decrease = f0 - model.best
        lam, value = model.argmin()
        if not decrease > 0:  # nothing decreased the loss yet: towards λ = 0, at most a decade at a time
            lam = min(max(lam, min(trials) / FIRST_JUMP), min(trials) / NUDGE)
            return lam, model(lam)
        if len(trials) == 1:  # the quadratic model's minimiser, within a decade, and not too close to the first trial
            if abs(math.log(lam / model.best_lam)) < math.log1p(SECOND_TRIAL_GAP):
                lam = model.best_lam * NUDGE
            return lam, model(lam)
        settled = trusted and model.best - value <= self.gain_tol * decrease
        left, right = model.neighbours
        if math.isinf(right) or (left == 0 and not lam > model.range[0]):
            return None if settled else self._past_the_end(model, lam)
        u_best = math.log(model.best_lam)
        u_lo = math.log(left) if left > 0 else u_best - math.log(FIRST_JUMP)
        u_hi = math.log(right)
        if left > 0 and u_hi - u_lo <= 2 * LOG_TOL:
            return None
        # A model fitted to trials decades apart can miss the basin entirely, and match the next trial by luck.
        if settled and (left == 0 or u_hi - u_lo <= SETTLE_LOG_WIDTH):
            return None
        return self._inside_bracket(model, lam, (u_lo, u_hi), trusted, inside)

    @staticmethod
    def _past_the_end(model: LocalModel, lam: float) -> tuple[float, float]:
        """The best trial is at an end (the largest λ tried, or the smallest with the model's minimiser lower
        still): past it as far as the model's minimiser ``lam``, or, where the model only says "further", by the
        last ratio of trials to the power of the golden ratio, between 2 and :data:`FIRST_JUMP`."""
        outward = 1 if math.isinf(model.neighbours[1]) else -1
        inner = model.neighbours[0] if outward > 0 else model.neighbours[1]
        if not (model.fitted and lam != model.range[outward > 0]
                and abs(math.log(lam / model.best_lam)) > LOG_TOL):
            ratio = (model.best_lam / inner) ** outward
            lam = model.best_lam * min(FIRST_JUMP, max(2.0, ratio**GOLDEN_RATIO)) ** outward
        return lam, model(lam)

    @staticmethod
    def _inside_bracket(model: LocalModel, lam: float, bracket: tuple[float, float], trusted: bool,
                        inside: list[tuple[float, bool]]) -> tuple[float, float]:
        """The model's minimiser ``lam`` under Brent's safeguards on ``log λ``, else a golden-section step.

        The model's point must lie inside ``bracket`` (on ``log λ``) by a tenth of its width, the bracket must
        have halved over the last two trials inside it, and the model must have predicted the last trial if that
        was the model's; it moves no closer to the best trial than :data:`LOG_TOL`. Records the step in ``inside``.
        """
        u_lo, u_hi = bracket
        u_best = math.log(model.best_lam)
        u = math.log(lam) if model.fitted else math.nan
        margin = 0.1 * (u_hi - u_lo)
        shrinking = len(inside) < 2 or u_hi - u_lo <= 0.5 * inside[-2][0]
        believed = trusted or not inside or inside[-1][1]
        golden = not (shrinking and believed and u_lo + margin <= u <= u_hi - margin)
        if golden:  # into the larger side: the bracket shrinks whatever the model says
            far = u_hi if u_hi - u_best >= u_best - u_lo else u_lo
            u = u_best + GOLDEN_SECTION * (far - u_best)
        elif abs(u - u_best) < LOG_TOL:
            u = u_best + math.copysign(LOG_TOL, u - u_best)
        inside.append((u_hi - u_lo, golden))
        lam = math.exp(u)
        return lam, model(lam)

    def _quadratic(self, prob: SearchProblem, log: list[str], info: dict) -> tuple[float, float]:
        """Minimise the quadratic through ``φ(0)``, ``φ'(0)`` and one trial; ``newton_steps`` refits.

        The first trial is one RMS logit per entry (``lam_unit``), capped by the step at
        which the linear model would remove the whole loss (``φ(0)/|φ'(0)|``). On the fast
        path the model's minimiser is returned unevaluated (loss ``nan``): the caller
        evaluates the truncated step anyway, and backtracks if it does not decrease the loss.
        """
        f0, g0 = prob.loss0, prob.slope0
        if not (math.isfinite(g0) and g0 < 0):
            log.append(f"quadratic: slope {g0:.3g} at λ=0 is not a descent; λ = 0")
            return 0.0, f0
        lam = _first_trial(prob)
        best = (0.0, f0)
        trials = []
        for _ in range(self.newton_steps):
            v = self.phi(prob, lam)
            trials.append(lam)
            if v < best[1]:
                best = (lam, v)
            curv = 2 * (v - f0 - g0 * lam) / lam**2 if math.isfinite(v) else math.inf
            # Concave between 0 and the trial: the minimiser lies beyond it, go four times further.
            new = -g0 / curv if curv > 0 else 4 * lam
            done = abs(new - lam) <= 0.1 * lam
            lam = new
            if done:
                break
        info["quadratic_trials"] = trials
        if not self.loss_is_final:
            return lam, math.nan
        v = self.phi(prob, lam)
        if v < best[1]:
            best = (lam, v)
        return best if best[0] > 0 else self._backtrack(prob, lam, log, "quadratic")

    def _grid(self, prob: SearchProblem) -> tuple[float, float]:
        lams = np.geomspace(self.lam_min, self.lam_max, self.n_grid - 1) * prob.lam_unit
        best = (0.0, prob.loss0)
        for lam in lams:
            v = self.phi(prob, float(lam))
            if v < best[1]:
                best = (float(lam), v)
        return best

    def _bounded(self, prob: SearchProblem, info: dict) -> tuple[float, float]:
        # On log λ, because the minimiser's scale is unknown over several decades.
        lo, hi = math.log(self.lam_min * prob.lam_unit), math.log(self.lam_max * prob.lam_unit)
        res = minimize_scalar(
            lambda t: self.phi(prob, math.exp(t)),
            bounds=(lo, hi),
            method="bounded",
            options={"xatol": 1e-3, "maxiter": self.maxiter},
        )
        info["bounded_iterations"] = int(res.nfev)
        lam, v = math.exp(float(res.x)), float(res.fun)
        return (lam, v) if v < prob.loss0 else (0.0, prob.loss0)

    def _derivatives(self, prob: SearchProblem, lam: float, path: Callable) -> tuple[float, float, float] | None:
        """``(φ, φ', φ'')`` at ``lam`` along ``path(prob, λ) -> scores`` by AD; None when the loss has no derivative
        there (it returned a tensor outside autograd's graph: detached, or computed off the scores).

        Reverse-over-reverse on the scalar λ: it works for any closure autograd can
        differentiate twice, whereas ``torch.func``'s forward-over-reverse rejects common
        closures (ours included: "ZeroTensors are immutable"), and on a scalar input it
        costs the same order, about one forward and two backward passes.
        """
        t = torch.tensor(lam, dtype=prob.X.dtype, device=prob.X.device, requires_grad=True)
        with torch.enable_grad():
            v = prob.loss(path(prob, t))
            if not v.requires_grad:
                return None
            (d1,) = torch.autograd.grad(v, t, create_graph=True, allow_unused=True)
            if d1 is None:
                return None
            (d2,) = torch.autograd.grad(d1, t) if d1.requires_grad else (torch.zeros_like(d1),)
        return float(v.detach()) + prob.penalty * lam, float(d1.detach()) + prob.penalty, float(d2)

    def _fast_path(self, prob: SearchProblem, lam: Tensor | float) -> Tensor:
        if isinstance(lam, float):
            return torch.add(prob.S0, prob.direction_scores(), alpha=-lam)  # one pass, one allocation
        return prob.S0 - lam * prob.direction_scores()

    def _newton(self, prob: SearchProblem, log: list[str], info: dict) -> tuple[float, float]:
        best = (0.0, prob.loss0)
        lam = 0.0
        slope0 = None
        proposal = None
        for step in range(self.newton_steps):
            # At λ = 0 the truncated path's SVD has repeated zero singular values and is not
            # differentiable: the fast path is used there. Its slope is the truncated path's only
            # when the part of P̂ outside Z's spaces has rank <= p (docs/mathematics.md §5.1).
            path = self._fast_path if lam == 0.0 else self.scores
            derivatives = self._derivatives(prob, lam, path)
            if derivatives is not None:  # the pass's loss is one loss call; its two derivatives are two more reads
                info["host_syncs"] = info.get("host_syncs", 0) + 2
            if derivatives is None:  # a detached loss (.item(), numpy, .detach()): search it without derivatives
                log.append(f"newton: loss_of_scores has no derivative along λ at λ={lam:.3g} (it returned a tensor "
                           "outside autograd's graph); used the bounded search instead")
                return self._bounded(prob, info)
            v, d1, d2 = derivatives
            if step == 0:
                slope0 = d1
            if lam > 0 and math.isfinite(v) and v < best[1]:
                best = (lam, v)
            if not (math.isfinite(d1) and math.isfinite(d2)):
                log.append(f"newton: non-finite derivatives at λ={lam:.3g}; kept the best point so far")
                proposal = None
                break
            if d2 <= 0:
                if step == 0:
                    log.append(f"newton: curvature {d2:.3g} <= 0 at λ=0, used the bounded search instead")
                    return self._bounded(prob, info)
                proposal = None
                break
            new = lam - d1 / d2
            if not new > 0:
                proposal = None
                break
            lam = proposal = new
        info["newton_lambda"] = proposal
        if proposal is None:
            return best
        v1 = self.phi(prob, proposal)
        if v1 < best[1]:
            best = (proposal, v1)
        # The loss at the Newton point and (φ(0), φ'(0)) fix a quadratic model; its minimiser
        # corrects the Newton step for the loss's departure from a quadratic (one evaluation).
        curv = 2 * (v1 - prob.loss0 - slope0 * proposal) / proposal**2 if math.isfinite(v1) else math.nan
        if curv > 0 and slope0 < 0:
            lam2 = -slope0 / curv
            if abs(lam2 - proposal) > 1e-3 * proposal:
                v2 = self.phi(prob, lam2)
                info["interpolated_lambda"] = lam2
                if v2 < best[1]:
                    best = (lam2, v2)
        # Neither point decreased the loss: halve the step until one does.
        return best if best[0] > 0 else self._backtrack(prob, proposal, log, "newton")

    def _backtrack(self, prob: SearchProblem, lam: float, log: list[str], who: str) -> tuple[float, float]:
        """Halve ``lam`` until the loss decreases (``max_backtrack`` times at most); else λ = 0, logged."""
        for _ in range(self.max_backtrack):
            lam /= 2
            v = self.phi(prob, lam)
            if v < prob.loss0:
                return lam, v
        log.append(f"{who}: no decrease after backtracking; λ = 0")
        return 0.0, prob.loss0


def _first_trial(prob: SearchProblem) -> float:
    """``λ_1`` of ``quadratic`` and ``bracket``: one RMS logit per entry, capped by the step at which the linear
    model would remove the whole loss (``φ(0)/|φ'(0)|``, for a positive loss and a descent slope ``slope0``: the
    fast path's, also where the bracket search models the normal path with its own)."""
    if prob.loss0 > 0 and prob.slope0 < 0:
        return min(prob.lam_unit, prob.loss0 / -prob.slope0)
    return prob.lam_unit


def factor_scores(X: Tensor, A: Tensor, B: Tensor) -> Tensor:
    """Scores ``(X A)(X B)ᵀ``, ``(b, d_s, d_s)``, of factors ``A, B (d_e, r)``: cheaper than ``X (A Bᵀ) Xᵀ``.

    Both ``X A`` and ``X B`` come from one product of the flattened batch with ``[A, B]``: two products
    ``(b·d_s, d_e) @ (d_e, r)`` are narrow: at ``r = 8``, ``d_e = 64`` they took 3× the time of the one (CPU, 1 thread).
    """
    L, R = score_factors(X, A, B)
    return L @ R.mT


def score_factors(X: Tensor, A: Tensor, B: Tensor) -> tuple[Tensor, Tensor]:
    """``(X A, X B)``, ``(b, d_s, r)`` each, the factors of the scores :func:`factor_scores` forms: from one
    product of the flattened batch with ``[A, B]``."""
    r = A.shape[1]
    XAB = (X.reshape(-1, X.shape[-1]) @ torch.cat([A, B], 1)).reshape(*X.shape[:-1], 2 * r)
    return XAB[..., :r], XAB[..., r:]


def loss_at_factors(loss_of_factors: Callable[[Tensor, Tensor], Tensor], X: Tensor, A: Tensor, B: Tensor) -> Tensor:
    """The loss at the scores ``(X A)(X B)ᵀ`` of the batch ``X`` ``(b, d_s, d_e)``, ``A, B`` ``(d_e, r)``, from
    ``loss_of_factors``, which takes the scores' factors (:func:`score_factors`)."""
    with section("trial scores"):
        L, R = score_factors(X, A, B)
    return loss_of_factors(L, R)


def truncated_scores(X: Tensor, U: Tensor, s: Tensor, V: Tensor) -> Tensor:
    """Scores ``X (U diag(s) Vᵀ) Xᵀ``, ``(b, d_s, d_s)``, through the rank-``r`` factors (:func:`factor_scores`)."""
    with section("trial scores"):
        return factor_scores(X, U * s, V)


@register("line_search")
class NormalSearch(LineSearch):
    """``λ ↦ L( X T_r(Z − λP̂) Xᵀ )``: the rank constraint inside every trial."""

    name = "normal"
    loss_is_final = True

    def scores(self, prob: SearchProblem, lam: Tensor | float) -> Tensor:
        return truncated_scores(prob.X, *prob.step_factors(lam))

    def loss_at(self, prob: SearchProblem, lam: float) -> Tensor:
        return prob.loss_at_step(*prob.step_factors(lam))

    def model_slope(self, prob: SearchProblem) -> float:
        """The truncated path's own slope at ``λ = 0⁺`` (:meth:`SearchProblem.truncated_slope`): where ``P̂`` has
        more weight outside ``Z``'s spaces than the rank keeps, the untruncated one is steeper (1.8 times at the
        scale set's ``d_e = 1024``, 3 times with the ``+shrink`` penalty; docs/mathematics.md §5.1), and a model
        fitted to it misplaces the trials."""
        return prob.truncated_slope()


@register("line_search")
class FastSearch(LineSearch):
    """``λ ↦ L( S − λ X P̂ Xᵀ )``: no SVD per trial; ``X P̂ Xᵀ`` is computed once.

    λ is chosen without the rank limit; :meth:`finish` truncates once, and if the
    truncated step does not decrease the loss, halves λ until it does (each halving one
    truncation and one evaluation, counted in ``n_loss_evals``); λ = 0 if none does.
    """

    name = "fast"

    def scores(self, prob: SearchProblem, lam: Tensor | float) -> Tensor:
        with section("trial scores"):
            return self._fast_path(prob, lam)

    def finish(self, prob, lam, loss_at, log, info):
        U, s, V, lam, _ = super().finish(prob, lam, loss_at, log, info)
        if lam == 0:
            return U, s, V, lam, None
        halvings = 0
        while True:
            with _timed(prob, "line_search"), torch.no_grad():
                v = float(prob.loss_at_step(U, s, V))
            if v < prob.loss0:
                break
            if halvings == self.max_backtrack:
                log.append(f"fast: no truncated step decreased the loss after {halvings} halvings; λ = 0")
                lam, v = 0.0, None
                with torch.no_grad():
                    U, s, V = prob.truncate(prob.Z)
                break
            halvings += 1
            lam /= 2
            with _timed(prob, "truncation"), torch.no_grad():
                U, s, V = prob.step_factors(lam)
        info["truncated_backtracks"] = halvings
        return U, s, V, lam, v


def _timed(prob: SearchProblem, phase: str):
    """Time a phase into ``prob.timings`` (synchronised on CUDA), or nothing when it has none."""
    return timed(prob.timings, phase, prob.X.device) if prob.timings is not None else nullcontext()

