"""A local model of the loss along the step, ``φ(λ)``, from a line search's trials (docs/mathematics.md §5.2).

The ``bracket`` search (:mod:`strategies.line_search`) asks it where the minimum is likely to be, what the loss
there would be, and so whether one more trial can still pay.
"""

from __future__ import annotations

import math

import numpy as np


class LocalModel:
    """``φ`` near the best trial: the cubic ``φ(0) + φ'(0) λ + a λ² + c λ³`` through the best trial and its
    neighbour on the side of λ = 0 (its neighbour above where it is the smallest trial; a quadratic, ``c = 0``,
    where it is the only one).

    The model's range is the bracket around the best trial: between its neighbours, from a decade below the
    smallest trial, or up to a decade beyond the largest. The exact value and slope at λ = 0 pin the model down
    (it is exact on a quadratic or cubic path); of the trials, those nearest λ = 0 on the best one's side are the
    ones it rests on. A trial past a cliff in the loss (the truncated path's shape where ``d_e`` is wide) bounds
    the bracket and is left out of the fit: a parabola in ``log λ`` through it, this model's predecessor inside a
    bracket, predicted the next trial's decrease wrong by a third or more there (docs/mathematics.md §5.2).

    Parameters
    ----------
    trials : dict of float to float
        ``λ > 0`` -> ``φ(λ)`` (finite, or ``inf``), at least one.
    f0, g0 : float
        ``φ(0)`` and the slope ``φ'(0)`` of the path searched.
    """

    def __init__(self, trials: dict[float, float], f0: float, g0: float) -> None:
        lams = sorted(trials)
        i = min(range(len(lams)), key=lambda j: trials[lams[j]])
        last = len(lams) - 1
        self.best_lam, self.best = lams[i], trials[lams[i]]
        self.f0, self.g0 = f0, g0
        self.neighbours = (lams[i - 1] if i > 0 else 0.0, lams[i + 1] if i < last else math.inf)
        pts = lams[:2] if i == 0 else [lams[i - 1], lams[i]]
        self.coef = self._cubic([(x, trials[x]) for x in pts])
        lo = lams[0] / 10 if i == 0 else lams[i - 1]
        self.range = (lo, lams[i + 1] if i < last else 10 * lams[i])

    def _cubic(self, pts: list[tuple[float, float]]) -> tuple[float, float] | None:
        """``(a, c)`` of ``φ(0) + φ'(0) λ + a λ² + c λ³`` through ``pts`` (one point: ``c = 0``); None if not finite."""
        if not all(math.isfinite(v) for _, v in pts):
            return None
        rows = [(x * x, x**3, v - self.f0 - self.g0 * x) for x, v in pts]
        if len(rows) == 1:
            return rows[0][2] / rows[0][0], 0.0
        (a1, b1, r1), (a2, b2, r2) = rows
        return tuple(np.linalg.solve([[a1, b1], [a2, b2]], [r1, r2]).tolist())

    @property
    def fitted(self) -> bool:
        """Whether the trials it rests on are all finite (a trial past an overflow is ``inf``)."""
        return self.coef is not None

    def __call__(self, lam: float) -> float:
        """The model's ``φ(lam)`` (``nan`` when not :attr:`fitted`)."""
        if self.coef is None:
            return math.nan
        a, c = self.coef
        return self.f0 + self.g0 * lam + a * lam**2 + c * lam**3

    def _cubic_argmin(self) -> float:
        lo, hi = self.range
        a, c = self.coef
        roots = np.roots([3 * c, 2 * a, self.g0]) if c != 0 else ([-self.g0 / (2 * a)] if a != 0 else [])
        inner = [float(r.real) for r in np.atleast_1d(roots) if abs(r.imag) < 1e-12 and lo < r.real < hi]
        return min([lo, hi, *inner], key=self)

    def argmin(self) -> tuple[float, float]:
        """``(λ, model φ(λ))`` of the model's least value on its range: stationary points and the range's ends."""
        if self.coef is None:
            return self.best_lam, self.best
        lam = self._cubic_argmin()
        return lam, self(lam)
