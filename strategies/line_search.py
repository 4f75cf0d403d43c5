"""Choosing the step λ along the normalised direction ``P̂`` (docs/mathematics.md §5).

- ``normal``: ``λ ↦ L( X T_r(Z − λP̂) Xᵀ )``, one truncation per trial;
- ``fast``: ``λ ↦ L( S − λ X P̂ Xᵀ )``, no rank constraint and no SVD per trial;
  the caller truncates once at the chosen λ.

Search methods: ``grid`` (0 and 16 geometric points), ``bounded`` (Brent's bounded
method of :func:`scipy.optimize.minimize_scalar`, on ``log λ``), ``newton`` (first and
second derivatives of the loss along the path by AD), ``quadratic`` (docs/mathematics.md §5: ``φ(0)``
and ``φ'(0) = −⟨G, X P̂ Xᵀ⟩`` cost nothing, one trial λ fixes a quadratic model; no AD),
``bracket`` (the quadratic model's guess, then :func:`scipy.optimize.bracket` on ``log λ``
and a few steps of Brent's method inside the bracket, more while it is wide: reaches the
path's best where the loss along the path is far from quadratic, in six to ten evaluations).

``P̂`` is normalised so that ``‖X P̂ Xᵀ‖_F = 1`` over the batch: λ is the Frobenius norm
of the (untruncated) score change. Searches are bracketed in units of
``sqrt(#attended entries)``, i.e. of a root-mean-square change of one logit per entry.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import bracket as scipy_bracket
from scipy.optimize import minimize_scalar
from torch import Tensor

from .registry import register
from .timing import timed

METHODS = ("grid", "bounded", "newton", "quadratic", "bracket")
#: Brent's tolerance inside the bracket on ``log λ``: it stops once λ is known to about ±5%.
BRENT_LOG_TOL = 0.05
#: Where the bracket search's coordinate ``log(λ/λ_1) + BRENT_OFFSET`` starts (see ``_bracket``).
BRENT_OFFSET = 100.0
#: Width on ``log λ`` of the bracket around the best trial (between its nearest trials on either side) above
#: which the bracket search goes on refining after ``refine_steps``: λ known to within a factor of 2 in all.
REFINE_LOG_WIDTH = math.log(2.0)
#: How far the bracket search's second trial may be from its first (a factor on λ, either way).
FIRST_JUMP = 10.0


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
    S0, D_hat : Tensor
        ``X Z Xᵀ`` and ``X P̂ Xᵀ``, ``(b, d_s, d_s)``.
    loss0 : float
        ``loss(S0)``.
    truncate : callable
        ``Y (d_e, d_e) -> (U, s, V)``, the strategy's truncation at the grown rank.
    lam_unit : float
        ``sqrt(#attended entries)``: λ of one RMS logit per entry.
    slope0 : float
        ``−⟨G, X P̂ Xᵀ⟩``: the fast path's slope at λ = 0, from the captured gradient.
    timings : dict, optional
        Where the finishing step adds its ``truncation`` and ``line_search`` seconds.
    """

    loss: Callable[[Tensor], Tensor]
    X: Tensor
    Z: Tensor
    P_hat: Tensor
    S0: Tensor
    D_hat: Tensor
    loss0: float
    truncate: Callable[[Tensor], tuple[Tensor, Tensor, Tensor]]
    lam_unit: float
    slope0: float = math.nan
    timings: dict[str, float] | None = None


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
    max_expand : int
        Expansions of :func:`scipy.optimize.bracket` before the bracket search gives up
        and keeps the best point seen.
    refine_steps : int
        Iterations of Brent's method inside the bracket (about one new trial each after
        the first). One parabolic step (what 1 gives) stopped at 95% of the dense scan's
        best at d_e = 1024, where the loss along the truncated path falls off a cliff just
        past its minimum; three reached 99.5% for two more trials.
    max_refine_steps : int
        Iterations of Brent's method in all: after ``refine_steps``, the search goes on
        while the bracket around the best trial is wider than a factor of 2 on λ
        (:data:`REFINE_LOG_WIDTH`). A bracket many times wider than the minimum's basin
        (a first guess a decade or more off) needs them (docs/mathematics.md §5.2).
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
        max_expand: int = 6,
        refine_steps: int = 3,
        max_refine_steps: int = 10,
    ) -> None:
        if method not in self.methods:
            raise ValueError(f"unknown search method {method!r}; valid: {', '.join(self.methods)}")
        if n_grid < 2:
            raise ValueError(f"n_grid must be >= 2, got {n_grid}")
        if not (0 < lam_min < lam_max):
            raise ValueError(f"need 0 < lam_min < lam_max, got {lam_min}, {lam_max}")
        if newton_steps < 1 or maxiter < 1 or max_backtrack < 0 or max_expand < 1 or refine_steps < 1:
            raise ValueError("newton_steps, maxiter, max_expand and refine_steps must be >= 1, max_backtrack >= 0")
        if max_refine_steps < refine_steps:
            raise ValueError(f"max_refine_steps must be >= refine_steps, got {max_refine_steps} < {refine_steps}")
        self.method = method
        self.n_grid = n_grid
        self.lam_min = lam_min
        self.lam_max = lam_max
        self.maxiter = maxiter
        self.newton_steps = newton_steps
        self.max_backtrack = max_backtrack
        self.max_expand = max_expand
        self.refine_steps = refine_steps
        self.max_refine_steps = max_refine_steps

    @abstractmethod
    def scores(self, prob: SearchProblem, lam: Tensor | float) -> Tensor:
        """Scores ``(b, d_s, d_s)`` at step ``lam`` (differentiable in a tensor ``lam``)."""

    def phi(self, prob: SearchProblem, lam: float) -> float:
        """The loss at ``lam``; non-finite losses become ``+inf`` so a search steps away from them."""
        with torch.no_grad():
            v = float(prob.loss(self.scores(prob, lam)))
        return v if math.isfinite(v) else math.inf

    def search(self, prob: SearchProblem, log: list[str], info: dict) -> tuple[float, float]:
        """Minimise the loss along the path; return ``(λ, loss at λ)``.

        λ = 0 (the current loss) is always a candidate, so the returned loss never
        exceeds ``prob.loss0`` along this path.
        """
        if self.method == "grid":
            return self._grid(prob)
        if self.method == "bounded":
            return self._bounded(prob, info)
        if self.method == "quadratic":
            return self._quadratic(prob, log, info)
        if self.method == "bracket":
            return self._bracket(prob, log, info)
        return self._newton(prob, log, info)

    def finish(self, prob: SearchProblem, lam: float, loss_at: float, log: list[str],
               info: dict) -> tuple[Tensor, Tensor, Tensor, float, float | None]:
        """The truncated step at the chosen λ: ``(U, s, V, λ, loss after or None if not evaluated)``."""
        with _timed(prob, "truncation"), torch.no_grad():
            U, s, V = prob.truncate(prob.Z - lam * prob.P_hat)
        return U, s, V, lam, (loss_at if lam > 0 else None)

    def _bracket(self, prob: SearchProblem, log: list[str], info: dict) -> tuple[float, float]:
        """Quadratic guess, then a bracket of the minimum on ``log λ``, then a few steps of Brent's method in it.

        The quadratic model of :meth:`_quadratic` gives a first pair of trials; downhill
        expansion (:func:`scipy.optimize.bracket`, golden-ratio steps with parabolic
        extrapolation) finds ``t_a < t_b < t_c`` with ``φ(t_b)`` below both ends; then
        ``refine_steps`` iterations of Brent's method (:func:`scipy.optimize.minimize_scalar`)
        inside it, and more, up to ``max_refine_steps`` in all, while the best trial's nearest
        trials on either side are more than a factor of 2 apart. Working on ``log λ`` makes the
        expansion reach a minimiser several decades from the first guess in a few steps.
        """
        f0, g0 = prob.loss0, prob.slope0
        if not (math.isfinite(g0) and g0 < 0):
            log.append(f"bracket: slope {g0:.3g} at λ=0 is not a descent; λ = 0")
            return 0.0, f0
        lam1 = min(prob.lam_unit, f0 / -g0) if f0 > 0 else prob.lam_unit
        # The search runs on u = log(λ/λ_1) + BRENT_OFFSET: scipy's Brent tolerance is relative
        # to |u|, so near BRENT_OFFSET it is an absolute tolerance on log λ.
        seen: dict[float, float] = {}

        def lam_at(u: float) -> float:
            return lam1 * math.exp(u - BRENT_OFFSET)

        def phi_u(u: float) -> float:
            if u not in seen:  # the bracket's points are cached: Brent's method pays only for new trials
                seen[u] = self.phi(prob, lam_at(u))
            return seen[u]

        v1 = phi_u(BRENT_OFFSET)
        curv = 2 * (v1 - f0 - g0 * lam1) / lam1**2 if math.isfinite(v1) else math.inf
        lam2 = -g0 / curv if curv > 0 else 4 * lam1
        # Keep the second trial distinct from the first and within a decade of it: a model fitted where the
        # path is flat can point far past a cliff, and the bracket would then start too wide to refine.
        ratio = min(max(lam2 / lam1, 1 / FIRST_JUMP), FIRST_JUMP)
        if abs(math.log(ratio)) < math.log(1.5):
            ratio = 2.0 if v1 < f0 else 0.25
        try:
            ua, ub, uc, fa, fb, fc, _ = scipy_bracket(phi_u, xa=BRENT_OFFSET, xb=BRENT_OFFSET + math.log(ratio),
                                                      maxiter=self.max_expand)
            if fb < min(fa, fc):
                self._refine(phi_u, (min(ua, uc), ub, max(ua, uc)), seen)
        except (RuntimeError, ValueError) as err:  # no bracket within max_expand: keep the best point seen
            log.append(f"bracket: no bracket after {self.max_expand} expansions ({type(err).__name__}); "
                       "kept the best point seen")
        u_best = min(seen, key=seen.get)
        info["bracket_trials"] = len(seen)
        lam, v = lam_at(u_best), seen[u_best]
        return (lam, v) if v < f0 else self._backtrack(prob, lam_at(min(seen)), log, "bracket")

    def _refine(self, phi_u: Callable[[float], float], bracket: tuple[float, float, float],
                seen: dict[float, float]) -> None:
        """Brent's method inside ``bracket`` (on u, see :meth:`_bracket`): ``refine_steps`` iterations, then one at
        a time from the bracket of the best trial, while that is wider than :data:`REFINE_LOG_WIDTH` and fewer
        than ``max_refine_steps`` have run. ``phi_u`` records every trial in ``seen``."""
        options = {"xtol": BRENT_LOG_TOL / BRENT_OFFSET}
        steps = self.refine_steps
        minimize_scalar(phi_u, bracket=bracket, method="brent", options={**options, "maxiter": steps})
        while steps < self.max_refine_steps:
            u_best = min(seen, key=seen.get)
            left = [u for u in seen if u < u_best]
            right = [u for u in seen if u > u_best]
            if not left or not right or min(right) - max(left) <= REFINE_LOG_WIDTH:
                return
            ua, uc = max(left), min(right)
            if not seen[u_best] < min(seen[ua], seen[uc]):  # a flat stretch: no bracket to narrow
                return
            minimize_scalar(phi_u, bracket=(ua, u_best, uc), method="brent", options={**options, "maxiter": 1})
            steps += 1

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
        lam = min(prob.lam_unit, f0 / -g0) if f0 > 0 else prob.lam_unit
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

    def _derivatives(self, prob: SearchProblem, lam: float, path: Callable) -> tuple[float, float, float]:
        """``(φ, φ', φ'')`` at ``lam`` along ``path(prob, λ) -> scores`` by AD.

        Reverse-over-reverse on the scalar λ: it works for any closure autograd can
        differentiate twice, whereas ``torch.func``'s forward-over-reverse rejects common
        closures (ours included: "ZeroTensors are immutable"), and on a scalar input it
        costs the same order, about one forward and two backward passes.
        """
        t = torch.tensor(lam, dtype=prob.X.dtype, device=prob.X.device, requires_grad=True)
        with torch.enable_grad():
            v = prob.loss(path(prob, t))
            (d1,) = torch.autograd.grad(v, t, create_graph=True)
            (d2,) = torch.autograd.grad(d1, t) if d1.requires_grad else (torch.zeros_like(d1),)
        return float(v.detach()), float(d1.detach()), float(d2)

    def _fast_path(self, prob: SearchProblem, lam: Tensor | float) -> Tensor:
        if isinstance(lam, float):
            return torch.add(prob.S0, prob.D_hat, alpha=-lam)  # one pass, one allocation
        return prob.S0 - lam * prob.D_hat

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
            v, d1, d2 = self._derivatives(prob, lam, path)
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


def truncated_scores(X: Tensor, U: Tensor, s: Tensor, V: Tensor) -> Tensor:
    """Scores ``X (U diag(s) Vᵀ) Xᵀ``, ``(b, d_s, d_s)``, through the rank-``r`` factors.

    ``X U`` and ``X V`` are ``(b, d_s, r)``: cheaper than forming ``X Z' Xᵀ`` through ``d_e``.
    """
    return ((X @ U) * s) @ (X @ V).mT


@register("line_search")
class NormalSearch(LineSearch):
    """``λ ↦ L( X T_r(Z − λP̂) Xᵀ )``: the rank constraint inside every trial."""

    name = "normal"
    loss_is_final = True

    def scores(self, prob: SearchProblem, lam: Tensor | float) -> Tensor:
        return truncated_scores(prob.X, *prob.truncate(prob.Z - lam * prob.P_hat))


@register("line_search")
class FastSearch(LineSearch):
    """``λ ↦ L( S − λ X P̂ Xᵀ )``: no SVD per trial; ``X P̂ Xᵀ`` is computed once.

    λ is chosen without the rank limit; :meth:`finish` truncates once, and if the
    truncated step does not decrease the loss, halves λ until it does (each halving one
    truncation and one evaluation, counted in ``n_loss_evals``); λ = 0 if none does.
    """

    name = "fast"

    def scores(self, prob: SearchProblem, lam: Tensor | float) -> Tensor:
        return self._fast_path(prob, lam)

    def finish(self, prob, lam, loss_at, log, info):
        U, s, V, lam, _ = super().finish(prob, lam, loss_at, log, info)
        if lam == 0:
            return U, s, V, lam, None
        halvings = 0
        while True:
            with _timed(prob, "line_search"), torch.no_grad():
                v = float(prob.loss(truncated_scores(prob.X, U, s, V)))
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
                U, s, V = prob.truncate(prob.Z - lam * prob.P_hat)
        info["truncated_backtracks"] = halvings
        return U, s, V, lam, v


def _timed(prob: SearchProblem, phase: str):
    """Time a phase into ``prob.timings`` (synchronised on CUDA), or nothing when it has none."""
    return timed(prob.timings, phase, prob.X.device) if prob.timings is not None else nullcontext()

