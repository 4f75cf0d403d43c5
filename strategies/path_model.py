"""A local model of the loss along the step, ``φ(λ)``, from a line search's trials (docs/mathematics.md §5.2).

The ``bracket`` search (:mod:`strategies.line_search`) asks it where the minimum is likely to be, what the loss
there would be, and so whether one more trial can still pay.
"""

from __future__ import annotations

import math

import numpy as np


class LocalModel:
    """``φ`` near the best trial, fitted to the trials beside it and to ``φ(0)``, ``φ'(0)``.

    - The best trial is at an end (the smallest or the largest λ tried): a cubic in λ through ``φ(0)``,
      ``φ'(0)``, the best trial and its neighbour (a quadratic when there is no other trial), from a decade
      below the best trial up to its neighbour, or from its neighbour up to a decade beyond it.
    - Otherwise a parabola in ``log λ`` through the best trial and its neighbours, between them.

    At an end the minimiser is outside the trials and must be extrapolated: there the exact value and slope
    at λ = 0 pin the model down (it is exact on a quadratic or cubic path). Inside a bracket the trials are
    close and often decades from 0, where a parabola in ``log λ`` follows the loss better.

    Parameters
    ----------
    trials : dict of float to float
        ``λ > 0`` -> ``φ(λ)`` (finite, or ``inf``), at least one.
    f0, g0 : float
        ``φ(0)`` and ``φ'(0)``.
    """

    def __init__(self, trials: dict[float, float], f0: float, g0: float) -> None:
        lams = sorted(trials)
        i = min(range(len(lams)), key=lambda j: trials[lams[j]])
        last = len(lams) - 1
        self.best_lam, self.best = lams[i], trials[lams[i]]
        self.f0, self.g0 = f0, g0
        self.neighbours = (lams[i - 1] if i > 0 else 0.0, lams[i + 1] if i < last else math.inf)
        if i == 0 or i == last:
            pts = lams[:2] if i == 0 else lams[i - 1:]
            self.kind = "cubic"
            self.coef = self._cubic([(x, trials[x]) for x in pts])
            self.range = (lams[0] / 10 if i == 0 else lams[i - 1], lams[1] if i == 0 and last > 0 else 10 * lams[i])
        else:
            pts = lams[i - 1:i + 2]
            self.kind = "parabola"
            values = [trials[x] for x in pts]
            self.coef = np.polyfit(np.log(pts), values, 2) if all(map(math.isfinite, values)) else None
            self.range = (pts[0], pts[2])

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
        if self.kind == "cubic":
            a, c = self.coef
            return self.f0 + self.g0 * lam + a * lam**2 + c * lam**3
        return float(np.polyval(self.coef, math.log(lam)))

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
        if self.kind == "cubic":
            lam = self._cubic_argmin()
        else:
            lo, hi = self.range
            u = -self.coef[1] / (2 * self.coef[0]) if self.coef[0] > 0 else math.nan  # the vertex, on log λ
            lam = min([lo, hi, *([math.exp(u)] if math.log(lo) < u < math.log(hi) else [])], key=self)
        return lam, self(lam)
