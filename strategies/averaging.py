"""The batch-averaging formulas (docs/mathematics.md §3): how one direction ``P`` is made
from many samples. Each takes an inverse component (``pinv`` or ``solve``).

=============  =========================================  ===============================
name           direction                                  statistics kept
=============  =========================================  ===============================
per-sample     ``E[X_b^† G_b X_b^†ᵀ]`` (formula 1)        running sum of per-sample ``P_b``
gram           ``E[A]^† E[M] E[A]^†`` (formulas 2 and 4)  ``Σ A_b``, ``Σ M_b``
mean-input     ``E[X]^† E[G] E[X]^†ᵀ`` (formula 3)        ``Σ X_b``, ``Σ G_b``
joint          solves ``E[A_b P A_b] = E[M_b]`` by PCG    every ``X_b`` (and mask)
=============  =========================================  ===============================
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from ._checks import check_number, pow2_scale
from .cg import CGInfo, joint_operator, pcg
from .registry import register
from .statistics import Statistics
from .timing import section


@dataclass(frozen=True)
class Rotated:
    """A direction and its halves in the eigenbasis of ``E[XᵀX] = V diag(w) Vᵀ`` that a ridge factorised (the
    strength search rotates the gradient halves into it): ``Vᵀ P V`` is entrywise there, and so is the metric of the
    same ``E[XᵀX]`` (:meth:`strategies.truncation.Metric.from_eigh`), so the step needs neither a factorisation of
    its own nor a ``(d_e, d_e)`` product to whiten them.

    Attributes
    ----------
    w : Tensor
        ``(d_e,)`` eigenvalues, clamped at 0.
    V : Tensor
        ``(d_e, d_e)`` eigenvectors.
    D, D_a : Tensor
        ``Vᵀ P V`` and ``Vᵀ P_a V``, ``(d_e, d_e)``, in ``V``'s dtype (``P_b``'s is ``D − D_a``); ``D_a`` is None
        where the halves were not asked for (``split=False``).
    M_a, M_b : Tensor
        ``Vᵀ M_a V`` and ``Vᵀ M_b V``, the gradient halves' sums, ``(d_e, d_e)`` (float64).
    """

    w: Tensor
    V: Tensor
    D: Tensor
    D_a: Tensor | None
    M_a: Tensor
    M_b: Tensor


class Direction(NamedTuple):
    """A raw direction and what a step can reuse of how it was made.

    ``P`` ``(d_e, d_e)``; ``halves``: ``(P_a, P_b)`` made the same way from each half of the samples
    (``P_a + P_b = P``), or None where the formula cannot split or ``rotated`` holds them; ``rotated``: the
    direction, its halves and the gradient halves in the eigenbasis of ``E[XᵀX]`` (:class:`Rotated`), or None.
    """

    P: Tensor
    halves: tuple[Tensor, Tensor] | None = None
    rotated: Rotated | None = None


class Averaging(ABC):
    """A batch-averaging formula: statistics to keep, and the direction made from them.

    Parameters
    ----------
    inverse : Pinv or Solve
        How ``†`` / ``^{-1}`` is applied.
    """

    name: str = ""

    def __init__(self, inverse) -> None:
        self.inverse = inverse

    def new_statistics(self) -> Statistics:
        """Empty statistics of the kind this formula needs."""
        return Statistics()

    @property
    def uses_half_sums(self) -> bool:
        """Whether the direction itself is made from the gradient's half sums (:meth:`Statistics.half_sums`); the
        default does not."""
        return False

    @abstractmethod
    def direction(self, stats: Statistics, log: list[str], info: dict) -> Tensor:
        """The raw direction ``P (d_e, d_e)`` from accumulated statistics.

        Fallbacks are appended to ``log``; solver diagnostics go into ``info``.
        """

    def direction_and_halves(self, stats: Statistics, log: list[str], info: dict,
                             split: bool = True) -> Direction:
        """``P`` and, with ``split``, its halves made the same way from each half of the samples (docs/mathematics.md
        §5.4); the default cannot split (``halves`` None)."""
        return Direction(self.direction(stats, log, info))


class _PerSampleStatistics(Statistics):
    """Adds ``Σ_b X_b^† G_b X_b^†ᵀ``, computed batched at each update (memory ``O(d_e²)``)."""

    def __init__(self, inverse) -> None:
        super().__init__()
        self.inverse = inverse
        self.sum_P: Tensor | None = None
        self.sum_P_even: Tensor | None = None

    def _accumulate(self, X: Tensor, G: Tensor, GX: Tensor, mask: Tensor | None) -> None:
        try:
            P = self.inverse.data_sandwich(X, G, self.log, GX=GX)
        except torch.linalg.LinAlgError as e:
            # In range, a batch factorises; one far larger than the first (which fixed the dtype) overflows it.
            raise ValueError(
                f"X: the per-sample {self.inverse.name} failed on this batch in {X.dtype} (max |X| "
                f"{float(X.abs().amax()):.3g}; {str(e).strip().splitlines()[0]}): accumulate batches of one magnitude"
            ) from None
        self.host_reads += getattr(self.inverse, "data_sandwich_host_reads", 0)
        self._add_to("sum_P", P.sum(dim=0))
        self._add_to("sum_P_even", P[self.even_samples(X.shape[0], X.device)].sum(dim=0))


@register("averaging")
class PerSample(Averaging):
    """Formula 1: ``E[A_b^† M_b A_b^†] = E[X_b^† G_b X_b^†ᵀ]``, one (pseudo-)inverse per sample."""

    name = "per-sample"

    def new_statistics(self) -> Statistics:
        return _PerSampleStatistics(self.inverse)

    def direction(self, stats: Statistics, log: list[str], info: dict) -> Tensor:
        stats._require()
        if not isinstance(stats, _PerSampleStatistics):
            raise ValueError("per-sample needs statistics from its own new_statistics()")
        return stats.sum_P / stats.n

    def direction_and_halves(self, stats, log, info, split=True):
        P = self.direction(stats, log, info)
        if not split:
            return Direction(P)
        even = stats.sum_P_even / stats.n
        return Direction(P, (even, P - even))


@register("averaging")
class Gram(Averaging):
    """Formulas 2 (with pinv) and 4 (with solve): ``E[A]^† E[M] E[A]^†``."""

    name = "gram"

    @property
    def uses_half_sums(self) -> bool:
        """A ridge choosing its strength (``alpha="auto"``) scores its candidates on the half sums."""
        return getattr(self.inverse, "alpha", None) == "auto"

    def direction(self, stats: Statistics, log: list[str], info: dict) -> Tensor:
        return self._made(stats, log, info, split=False).P

    def direction_and_halves(self, stats, log, info, split=True):
        if type(self).direction is not Gram.direction:  # a subclass's own direction (a plugin's) makes P alone
            return super().direction_and_halves(stats, log, info, split)
        return self._made(stats, log, info, split)

    def _made(self, stats: Statistics, log: list[str], info: dict, split: bool) -> Direction:
        # The halves let a ridge choose its strength (inverse ridge); the others ignore them, and statistics made for
        # a strategy that uses none keep none.
        halves = stats.half_sums() if stats.sum_M_even is not None else None
        factor = self.inverse.factor(stats.mean_A, log, halves=halves)
        if factor.null_dims:
            info["null_directions"] = factor.null_dims
        if getattr(factor, "alpha", None) is not None:
            info["ridge_alpha"] = factor.alpha
            info["ridge_cosine"] = factor.cosine
        info["factor_host_syncs"] = factor.host_syncs
        # A ridge that chose its strength from the halves holds them in A's eigenbasis already: the direction is
        # entrywise there and two products from there, not the four of a sandwich (M = M_a + M_b); its halves stay
        # there (the split-half estimate and the metric work in that basis).
        rotated = getattr(factor, "rotated_halves", None)
        with section("direction"):
            if rotated is None:
                P = factor.sandwich(stats.mean_M)
                even = factor.sandwich(halves[0] / stats.n) if split else None
                return Direction(P, None if even is None else (even, P - even))
            M_a, M_b = rotated
            D = factor.rotated_sandwich((M_a + M_b) / stats.n)
            P = factor.V @ D @ factor.V.mT
            D_a = factor.rotated_sandwich(M_a / stats.n) if split else None
        return Direction(P, None, Rotated(factor.w, factor.V, D, D_a, M_a, M_b))


class _MeanInputStatistics(Statistics):
    """Adds ``Σ_b X_b (d_s, d_e)`` and ``Σ_b G_b (d_s, d_s)``: every batch needs the same ``d_s``."""

    def __init__(self) -> None:
        super().__init__()
        self.sum_X: Tensor | None = None
        self.sum_G: Tensor | None = None

    def _accumulate(self, X: Tensor, G: Tensor, GX: Tensor, mask: Tensor | None) -> None:
        if self.sum_X is not None and self.sum_X.shape != X.shape[1:]:
            raise ValueError(
                f"mean-input averages sequences position by position: every batch needs "
                f"d_s={self.sum_X.shape[0]}, got {X.shape[1]}"
            )
        self._add_to("sum_X", X.sum(dim=0))
        self._add_to("sum_G", G.sum(dim=0))


@register("averaging")
class MeanInput(Averaging):
    """Formula 3: ``E[X]^† E[G] (E[X]^†)ᵀ``, averaging sequences before inverting."""

    name = "mean-input"

    def new_statistics(self) -> Statistics:
        return _MeanInputStatistics()

    def direction(self, stats: Statistics, log: list[str], info: dict) -> Tensor:
        stats._require()
        if not isinstance(stats, _MeanInputStatistics):
            raise ValueError("mean-input needs statistics from its own new_statistics()")
        return self.inverse.data_sandwich(stats.sum_X / stats.n, stats.sum_G / stats.n, log)


class _JointStatistics(Statistics):
    """Keeps every ``X_b`` and its mask: memory ``O(N · d_s · d_e)`` for ``N`` samples.

    The joint operator ``P ↦ E[X_bᵀ(mask_b ⊙ X_b P X_bᵀ)X_b]`` does not factor through
    any fixed-size summary, so the exact direction costs memory linear in the samples.
    """

    def __init__(self) -> None:
        super().__init__()
        self.Xs: list[Tensor] = []
        self.masks: list[Tensor | None] = []
        self.sum_M64: Tensor | None = None

    def _accumulate(self, X: Tensor, G: Tensor, GX: Tensor, mask: Tensor | None) -> None:
        # The right-hand side in float64: the solve amplifies its rounding by 1/λ² in weak
        # directions of E[A], so float32 sums would decide those directions by noise.
        Xd = X.double()
        M = Xd.reshape(-1, X.shape[-1]).mT @ (G.double() @ Xd).reshape(-1, X.shape[-1])
        if self.Xs and self.Xs[0].shape[1] != X.shape[1]:
            raise ValueError(
                f"joint keeps batches stacked: every batch needs d_s={self.Xs[0].shape[1]}, got {X.shape[1]}"
            )
        self._add_to("sum_M64", M)
        self.Xs.append(X.detach())
        self.masks.append(None if mask is None else mask.expand(X.shape[0], -1, -1))

    def without_last(self) -> _JointStatistics:
        out = super().without_last()
        out.Xs, out.masks = self.Xs[:-1], self.masks[:-1]
        return out

    def stacked(self) -> tuple[Tensor, Tensor | None]:
        """All samples ``X (N, d_s, d_e)`` and their masks ``(N, d_s, d_s)`` (None if none was given)."""
        X = torch.cat(self.Xs) if len(self.Xs) > 1 else self.Xs[0]
        if all(m is None for m in self.masks):
            return X, None
        d_s = X.shape[1]
        full = torch.ones(d_s, d_s, dtype=torch.bool, device=X.device)
        masks = [full.expand(x.shape[0], -1, -1) if m is None else m for x, m in zip(self.Xs, self.masks, strict=True)]
        return X, torch.cat(masks)


@register("averaging")
class Joint(Averaging):
    """The exact direction: solves ``E[A_b P A_b] = E[M_b]`` (masked operator if a mask is given).

    Matrix-free preconditioned CG with preconditioner ``R ↦ E[A]^{-1} R E[A]^{-1}``
    (applied by the inverse component), so formula 2 is its first iterate.

    Parameters
    ----------
    inverse : Pinv or Solve
        Applies the preconditioner.
    tol : float
        Relative residual at which CG stops.
    maxiter : int
        Iteration cap; stopping there is recorded as a fallback.
    dtype : str, optional
        Precision of the CG solve (default ``"float64"``; ``None`` keeps the inputs').
        The operator ``E[A_b P A_b]`` squares the condition number of the inputs: at
        ``cond(E[A]) ≳ 3·10³`` it is below float32's resolution in the weak directions,
        where float32 CG stagnates and fills ``P`` with noise (seen on the digits task).

    Notes
    -----
    ``E[A]`` and ``E[M]`` are formed in float64 (``E[M]`` while accumulating, ``E[A]``
    from the kept inputs): the solve amplifies their rounding by ``1/λ²`` in a direction
    of eigenvalue ``λ``. The preconditioner's default cutoff is ``sqrt(d_e · eps)`` of
    the solve's dtype relative to ``E[A]``'s largest eigenvalue, which keeps that noise
    below ``sqrt(eps)`` in score space; directions below it are left out of ``P``.
    """

    name = "joint"

    def __init__(self, inverse, tol: float = 1e-6, maxiter: int = 200, dtype: str | None = "float64") -> None:
        super().__init__(inverse)
        if dtype is not None and dtype not in ("float32", "float64"):
            raise ValueError(f"joint dtype must be 'float32', 'float64' or None, got {dtype!r}")
        self.dtype = None if dtype is None else getattr(torch, dtype)
        check_number("joint tol", tol)
        check_number("joint maxiter", maxiter, integer=True)
        if not (0 < tol < 1):
            raise ValueError(f"joint tol must be in (0, 1), got {tol!r}")
        if maxiter < 1:
            raise ValueError(f"joint maxiter must be >= 1, got {maxiter!r}")
        self.tol = tol
        self.maxiter = maxiter

    def new_statistics(self) -> Statistics:
        return _JointStatistics()

    def direction(self, stats: Statistics, log: list[str], info: dict) -> Tensor:
        stats._require()
        if not isinstance(stats, _JointStatistics):
            raise ValueError("joint needs statistics from its own new_statistics()")
        X, mask = stats.stacked()
        dt = self.dtype or X.dtype
        Xc = X.to(dt)
        Xf = Xc.reshape(-1, Xc.shape[-1])
        # E[A] again in the solve's precision: the float32 running sum has rounding-level
        # eigenvalues where the inputs are null, which the preconditioner would amplify.
        mean_A = Xf.mT @ Xf / X.shape[0]
        rtol = math.sqrt(X.shape[-1] * torch.finfo(X.dtype).eps)
        rhs = (stats.sum_M64 / stats.n).to(dt)
        # The solve is linear in rhs: solving for rhs / s (s a power of two, exact) keeps CG's
        # ‖rhs‖² and inner products inside float32's range for statistics of an extreme G.
        s = pow2_scale(rhs)
        P, cg = solve_joint(Xc, mask, mean_A, rhs / s, self.inverse, self.tol, self.maxiter, log, rtol=rtol)
        info["cg_iterations"] = cg.iterations
        info["cg_residual"] = cg.residual
        info["factor_host_syncs"] = cg.host_reads
        return (P * s).to(X.dtype)


def solve_joint(
    X: Tensor,
    mask: Tensor | None,
    mean_A: Tensor,
    rhs: Tensor,
    inverse,
    tol: float,
    maxiter: int,
    log: list[str],
    rtol: float | None = None,
) -> tuple[Tensor, CGInfo]:
    """Solve the joint normal equations for ``X (N, d_s, d_e)`` with right-hand side ``rhs (d_e, d_e)``.

    The preconditioner ``R ↦ E[A]^{-1} R E[A]^{-1}`` uses ``inverse`` with default cutoff
    ``rtol``. Non-convergence is appended to ``log``.
    """
    prec = inverse.factor(mean_A, log, rtol=rtol)
    P, cg = pcg(joint_operator(X, mask), rhs, prec.sandwich, tol=tol, maxiter=maxiter)
    cg.host_reads = getattr(cg, "host_reads", 0) + prec.host_syncs
    if not cg.converged:
        log.append(
            f"joint: CG stopped after {cg.iterations} iterations at relative residual {cg.residual:.2e} > tol {tol:.0e}"
        )
    return P, cg

