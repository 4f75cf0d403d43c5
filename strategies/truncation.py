"""Truncated SVD ``T_r`` of the step ``Z − λP̂`` (docs/mathematics.md §4): full or randomised, plain or metric-aware.

A truncation returns factors ``(U (d, r), s (r,), V (d, r))`` with ``T_r(Y) = U diag(s) Vᵀ``.
Metric-aware truncation ``T_r^L(Y) = L^{-T} T_r(Lᵀ Y L) L^{-1}`` with ``L Lᵀ = E[A]``
minimises the error in score space ``‖X (Y − Z') Xᵀ‖`` rather than ``‖Y − Z'‖``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable

import torch
from torch import Tensor

from ._checks import check_number
from .gram import factor_psd
from .registry import register
from .timing import section


class Metric:
    """A factor ``L`` with ``L Lᵀ = E[A]`` (null directions floored) for metric-aware truncation.

    The best rank-``r`` ``Z'`` in ``‖Lᵀ(Y − Z')L‖_F`` is ``L^{-T} T_r(Lᵀ Y L) L^{-1}``, and
    ``‖Lᵀ B L‖_F = ‖E[A]^{1/2} B E[A]^{1/2}‖_F`` for every ``B`` and every such ``L``
    (both equal ``tr(B E[A] Bᵀ E[A])^{1/2}``). So a Cholesky factor attains the same
    optimum as the symmetric square root, at a fraction of an eigendecomposition's cost.

    Parameters
    ----------
    mean_A : Tensor
        ``E[XᵀX]``, ``(d_e, d_e)``.
    rtol : float, optional
        Eigenvalues of ``E[A]`` below ``rtol · ‖E[A]‖`` are numerically zero (default
        ``10 · d_e · eps(dtype)``, the rounding level of a computed Gram matrix). All
        others are kept exactly, so the truncation attains the optimal functional error
        on any numerically non-singular ``E[A]``.

    Attributes
    ----------
    L : Tensor
        ``(d_e, d_e)``, lower triangular unless made from an eigendecomposition (:meth:`from_eigh`, or the
        fallback): then ``V diag(w)^{1/2}``.
    eigenbasis : Tensor or None
        ``V`` of that eigendecomposition, ``(d_e, d_e)``; None for a Cholesky factor.
    null_dims : int
        Null directions found and floored.
    log : list of str
        The fallback, if one happened.

    Notes
    -----
    Null eigenvalues are raised to ``sqrt(rtol) · max diag(E[A])`` rather than dropped or
    kept at rounding level. Dropping them (a pseudo-inverse) would discard the components
    of ``Z`` outside the inputs' span, changing the block's function on new inputs at
    λ = 0. Keeping them at rounding level would let ``L^{-T} · L^{-1}`` amplify the
    SVD's backward error ``eps · ‖Lᵀ Y L‖`` by ``1/rtol`` into ``O(‖Y‖)`` noise in those
    directions; at ``sqrt(rtol)`` that noise is ``O(sqrt(eps) · ‖Y‖)``. In directions the
    inputs do span, the amplified noise is at rounding level in score space, because
    those inputs carry energy ``∝ λ_i`` there. The null directions are found once per
    metric by :func:`strategies.gram.factor_psd`; an eigendecomposition runs only when
    that fails, and is recorded in ``log``. Where the caller holds an eigendecomposition of
    ``E[A]`` already (a ridge chose its strength with one), :meth:`from_eigh` floors the same
    matrix from it and factorises nothing.
    """

    def __init__(self, mean_A: Tensor, rtol: float | None = None) -> None:
        tol = self._tol(mean_A, rtol)
        self.log: list[str] = []
        self.eigenbasis: Tensor | None = None
        factor = factor_psd(mean_A, tol, lift=math.sqrt(tol))
        self.host_syncs = 0 if factor is None else factor.host_syncs
        if factor is not None:
            self.L, self.null_dims = factor.L, factor.n_null
            return
        w, V = torch.linalg.eigh(mean_A)
        self._from_eigh(w, V, tol)
        self.log.append("metric: Cholesky with null directions removed failed; used eigh")

    @classmethod
    def from_eigh(cls, w: Tensor, V: Tensor, rtol: float | None = None) -> Metric:
        """The metric of ``E[A] = V diag(w) Vᵀ`` from an eigendecomposition the caller has already made (a
        ridge's, :class:`strategies.inverse.Ridge`): no factorisation of its own, and directions held in that
        eigenbasis are whitened entrywise (:meth:`whiten_rotated`).

        Parameters
        ----------
        w : Tensor
            ``(d_e,)`` eigenvalues (negative rounding clamped to 0 or not).
        V : Tensor
            ``(d_e, d_e)`` orthonormal eigenvectors, in the dtype the metric is to work in.
        rtol : float, optional
            As for the constructor, for ``V``'s dtype.
        """
        metric = cls.__new__(cls)
        metric.log = []
        metric._from_eigh(w.to(V.dtype), V, cls._tol(V, rtol))
        return metric

    @staticmethod
    def _tol(A: Tensor, rtol: float | None) -> float:
        if rtol is not None and not (0 < rtol < 1):
            raise ValueError(f"metric rtol must be in (0, 1), got {rtol!r}")
        return 10 * A.shape[-1] * torch.finfo(A.dtype).eps if rtol is None else rtol

    def _from_eigh(self, w: Tensor, V: Tensor, tol: float) -> None:
        """``L = V diag(w_f)^{1/2}`` with ``w_f`` the eigenvalues of the matrix :func:`strategies.gram.factor_psd`
        factorises, ``A + δI + f N Nᵀ`` (``δ = tol · max diag(A)``, ``f = sqrt(tol) · max diag(A)``, ``N`` the
        eigenvectors below ``tol · ‖A‖_F``): both ways give one metric."""
        w = w.clamp_min(0)
        scale = (V.square() @ w).amax()  # max diag(A), without forming A
        null = w <= tol * torch.linalg.vector_norm(w)
        w_floored = w + tol * scale + torch.where(null, math.sqrt(tol) * scale, torch.zeros_like(w))
        self.eigenbasis, self._sqrt_w = V, w_floored.sqrt()
        self.L = V * self._sqrt_w
        self.null_dims = int(null.sum())  # one host read
        self.host_syncs = 1

    def whiten(self, Y: Tensor) -> Tensor:
        """``Lᵀ Y L``, ``(d_e, d_e)``."""
        return self.L.mT @ Y @ self.L

    def whiten_factors(self, A: Tensor, B: Tensor) -> Tensor:
        """``Lᵀ (A Bᵀ) L`` for factors ``A, B (d_e, k)``: ``(Lᵀ A)(Lᵀ B)ᵀ``, two ``(d_e, d_e, k)`` products in place
        of two ``(d_e, d_e, d_e)`` ones."""
        return (self.L.mT @ A) @ (self.L.mT @ B).mT

    def unwhiten(self, U: Tensor) -> Tensor:
        """``L^{-T} U`` for ``U (d_e, r)``: factors of a whitened matrix back to the original basis."""
        if self.eigenbasis is None:  # a Cholesky factor
            return torch.linalg.solve_triangular(self.L.mT, U, upper=True)
        return self.eigenbasis @ (U / self._sqrt_w.unsqueeze(-1))

    def whiten_rotated(self, D: Tensor) -> Tensor:
        """``Lᵀ Y L`` for ``Y = V D Vᵀ`` given as ``D`` in the metric's :attr:`eigenbasis` ``V``, ``(d_e, d_e)``:
        ``√w_i D_ij √w_j``, entrywise (``Lᵀ V = diag(√w)``)."""
        return self._sqrt_w.unsqueeze(-1) * D * self._sqrt_w

    def whiten_gradient_rotated(self, N: Tensor) -> Tensor:
        """``L⁻¹ M L⁻ᵀ`` for ``M = V N Vᵀ`` given as ``N`` in the metric's :attr:`eigenbasis`: ``N_ij / (√w_i √w_j)``
        (the whitening under which ``⟨L⁻¹ M L⁻ᵀ, Lᵀ P L⟩ = ⟨M, P⟩``)."""
        return N / self._sqrt_w.unsqueeze(-1) / self._sqrt_w


class Truncation(ABC):
    """Best rank-``r`` factors of a ``(d, d)`` matrix.

    Parameters
    ----------
    metric : bool
        Truncate in the metric of the inputs (``+metric`` in a spec).
    metric_rtol : float, optional
        Eigenvalue floor of the metric, see :class:`Metric`.
    """

    name: str = ""

    def __init__(self, metric: bool = False, metric_rtol: float | None = None) -> None:
        check_number("truncation metric_rtol", metric_rtol, optional=True)
        if metric_rtol is not None and not 0 < metric_rtol < 1:
            raise ValueError(f"truncation metric_rtol must be in (0, 1), got {metric_rtol!r}")
        self.metric = bool(metric)
        self.metric_rtol = metric_rtol

    @abstractmethod
    def _svd(self, Y: Tensor, rank: int) -> tuple[Tensor, Tensor, Tensor]:
        """Top-``rank`` singular triplets ``(U, s, V)`` of ``Y``."""

    def triplets(self, Y: Tensor, rank: int) -> tuple[Tensor, Tensor, Tensor]:
        """``Y``'s top-``rank`` singular triplets ``(U, s, V)``, found the way this truncation finds them (``Y``
        already in its geometry: no metric, and no profile section of its own)."""
        return self._svd(Y, rank)

    def top_subspace(self, Y: Tensor, rank: int) -> tuple[Tensor, Tensor]:
        """``Y``'s top-``rank`` left and right singular vectors, ``(d, rank)`` each, found the way this truncation
        finds them (``Y`` already in its geometry: no metric)."""
        U, _, V = self.triplets(Y, rank)
        return U, V

    def __call__(self, Y: Tensor, rank: int, metric: Metric | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """``T_rank(Y)`` (or ``T_rank^W(Y)`` when ``metric`` is given) as ``(U, s, V)``."""
        with section("truncation"):
            if metric is None:
                return self._svd(Y, rank)
            return self._unwhitened(self._svd(metric.whiten(Y), rank), metric)

    def along(self, Z: Tensor, P_hat: Tensor, rank: int, metric: Metric | None = None, *,
              Z_factors: tuple[Tensor, Tensor] | None = None,
              P_whitened: Tensor | None = None) -> Callable[[Tensor | float], tuple[Tensor, Tensor, Tensor]]:
        """``λ ↦ T_rank(Z − λ P̂)`` (in the metric where one is given), for the trials of one line search.

        The metric's whitening ``Lᵀ Y L`` is linear in ``Y``: ``Z`` and ``P̂`` are whitened once, and each trial
        whitens by one ``axpy`` instead of two ``(d_e, d_e)`` products (at ``d_e = 1024`` those were 60 % of a
        trial's truncation). The same ``T_rank`` up to the rounding of the whitening.

        Parameters
        ----------
        Z, P_hat : Tensor
            ``(d_e, d_e)``: the current product and the step's direction.
        rank : int
            Rank kept.
        metric : Metric, optional
            The inputs' metric (``+metric``).
        Z_factors : (Tensor, Tensor), optional
            ``(A, B)`` with ``Z = A Bᵀ``, ``(d_e, d_k)`` each: ``Z`` is whitened through them
            (:meth:`Metric.whiten_factors`).
        P_whitened : Tensor, optional
            ``Lᵀ P̂ L`` where the caller whitened the direction already (the split-half estimate does).

        Returns
        -------
        callable
            ``λ`` (a float, or a 0-dim tensor to differentiate through) ``-> (U, s, V)``.
        """
        if metric is None:
            return lambda lam: self(Z - lam * P_hat, rank)
        whitened: list[Tensor] = []

        def truncate(lam: Tensor | float) -> tuple[Tensor, Tensor, Tensor]:
            with section("truncation"):
                if not whitened:  # on the first trial: a search that makes none pays nothing
                    whitened.extend((metric.whiten(Z) if Z_factors is None else metric.whiten_factors(*Z_factors),
                                     metric.whiten(P_hat) if P_whitened is None else P_whitened))
                Z_w, P_w = whitened
                Y = torch.add(Z_w, P_w, alpha=-lam) if isinstance(lam, float) else Z_w - lam * P_w
                return self._unwhitened(self._svd(Y, rank), metric)

        return truncate

    @staticmethod
    def _unwhitened(factors: tuple[Tensor, Tensor, Tensor], metric: Metric) -> tuple[Tensor, Tensor, Tensor]:
        """Whitened factors ``(U, s, V)`` back to the original basis."""
        U, s, V = factors
        return metric.unwhiten(U), s, metric.unwhiten(V)


@register("truncation")
class FullSVD(Truncation):
    """Eckart–Young truncation by ``torch.linalg.svd``."""

    name = "full"

    def _svd(self, Y: Tensor, rank: int) -> tuple[Tensor, Tensor, Tensor]:
        U, s, Vh = torch.linalg.svd(Y, full_matrices=False)
        return U[:, :rank], s[:rank], Vh[:rank].mT


@register("truncation")
class RandomizedSVD(Truncation):
    """Randomised truncation by ``torch.svd_lowrank`` (Halko et al.).

    Parameters
    ----------
    oversample : int
        Extra sketch columns beyond ``rank``.
    n_iter : int
        Power iterations (sharpen a slowly decaying spectrum). The defaults, 16 and 4, come
        from the scale set at d_e = 768 (teacher, rank 64): torch's own (8 columns, 2
        iterations) left the step's optimality 1.3 % short of a full SVD's, 16 and 4 leave
        0.2 % for a truncation still 2.5–5× cheaper than the full SVD at d_e 768–1024
        (README, scale section).
    seed : int
        Seed of the sketch. The global RNG is forked around the call, so results are
        reproducible and callers' random streams are left untouched.
    """

    name = "rsvd"

    def __init__(
        self,
        metric: bool = False,
        metric_rtol: float | None = None,
        oversample: int = 16,
        n_iter: int = 4,
        seed: int = 0,
    ) -> None:
        super().__init__(metric, metric_rtol)
        for name, value in (("oversample", oversample), ("n_iter", n_iter), ("seed", seed)):
            check_number(f"rsvd {name}", value, integer=True)
        if oversample < 0 or n_iter < 0:
            raise ValueError(f"rsvd needs oversample >= 0 and n_iter >= 0, got {oversample}, {n_iter}")
        self.oversample = oversample
        self.n_iter = n_iter
        self.seed = seed

    def _svd(self, Y: Tensor, rank: int) -> tuple[Tensor, Tensor, Tensor]:
        q = min(rank + self.oversample, *Y.shape)
        devices = [Y.device] if Y.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(self.seed)
            U, s, V = torch.svd_lowrank(Y, q=q, niter=self.n_iter)
        return U[:, :rank], s[:rank], V[:, :rank]

