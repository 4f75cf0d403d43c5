"""Truncated SVD ``T_r`` of the step ``Z − λP̂`` (MATH §4): full or randomised, plain or metric-aware.

A truncation returns factors ``(U (d, r), s (r,), V (d, r))`` with ``T_r(Y) = U diag(s) Vᵀ``.
Metric-aware truncation ``T_r^W(Y) = W^{-1} T_r(W Y W) W^{-1}`` with ``W = E[A]^{1/2}``
minimises the error in score space ``‖X (Y − Z') Xᵀ‖`` rather than ``‖Y − Z'‖``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

import torch
from torch import Tensor


class Metric:
    """``W = E[A]^{1/2}`` and ``W^{-1}`` for metric-aware truncation.

    Parameters
    ----------
    mean_A : Tensor
        ``E[XᵀX]``, ``(d_e, d_e)``.
    rtol : float, optional
        Eigenvalues of ``E[A]`` below ``rtol · λ_max`` are numerically zero (default
        ``10 · d_e · eps(dtype)``, the rounding level of a computed Gram matrix). All
        others are kept exactly, so ``W = E[A]^{1/2}`` on any numerically non-singular
        ``E[A]`` and the truncation attains the optimal functional error there.

    Notes
    -----
    Null eigenvalues are raised to ``sqrt(rtol) · λ_max`` rather than dropped or kept at
    rounding level. Dropping them (a pseudo-inverse) would discard the components of
    ``Z`` outside the inputs' span, changing the block's function on new inputs at
    λ = 0. Keeping them at rounding level would let ``W^{-1} · W^{-1}`` amplify the
    SVD's backward error ``eps · ‖W Y W‖`` by ``1/rtol`` into ``O(‖Y‖)`` noise in
    those directions; at ``sqrt(rtol)`` that noise is ``O(sqrt(eps) · ‖Y‖)``. In
    directions the inputs do span, the amplified noise is at rounding level in score
    space, because those inputs carry energy ``∝ λ_i`` there.
    """

    def __init__(self, mean_A: Tensor, rtol: float | None = None) -> None:
        if rtol is not None and not (0 < rtol < 1):
            raise ValueError(f"metric rtol must be in (0, 1), got {rtol!r}")
        w, V = torch.linalg.eigh(mean_A)
        tol = 10 * mean_A.shape[-1] * torch.finfo(w.dtype).eps if rtol is None else rtol
        top = w.amax().clamp_min(torch.finfo(w.dtype).tiny)
        w = torch.where(w > tol * top, w, math.sqrt(tol) * top)
        sq = w.sqrt()
        self.W = (V * sq) @ V.mT
        self.W_inv = (V / sq) @ V.mT


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
        self.metric = bool(metric)
        self.metric_rtol = metric_rtol

    @abstractmethod
    def _svd(self, Y: Tensor, rank: int) -> tuple[Tensor, Tensor, Tensor]:
        """Top-``rank`` singular triplets ``(U, s, V)`` of ``Y``."""

    def __call__(self, Y: Tensor, rank: int, metric: Metric | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """``T_rank(Y)`` (or ``T_rank^W(Y)`` when ``metric`` is given) as ``(U, s, V)``."""
        if metric is None:
            return self._svd(Y, rank)
        U, s, V = self._svd(metric.W @ Y @ metric.W, rank)
        return metric.W_inv @ U, s, metric.W_inv @ V


class FullSVD(Truncation):
    """Eckart–Young truncation by ``torch.linalg.svd``."""

    name = "full"

    def _svd(self, Y: Tensor, rank: int) -> tuple[Tensor, Tensor, Tensor]:
        U, s, Vh = torch.linalg.svd(Y, full_matrices=False)
        return U[:, :rank], s[:rank], Vh[:rank].mT


class RandomizedSVD(Truncation):
    """Randomised truncation by ``torch.svd_lowrank`` (Halko et al.).

    Parameters
    ----------
    oversample : int
        Extra sketch columns beyond ``rank``.
    n_iter : int
        Power iterations (sharpen a slowly decaying spectrum).
    seed : int
        Seed of the sketch. The global RNG is forked around the call, so results are
        reproducible and callers' random streams are left untouched.
    """

    name = "rsvd"

    def __init__(
        self,
        metric: bool = False,
        metric_rtol: float | None = None,
        oversample: int = 8,
        n_iter: int = 2,
        seed: int = 0,
    ) -> None:
        super().__init__(metric, metric_rtol)
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


TRUNCATIONS: dict[str, type] = {"full": FullSVD, "rsvd": RandomizedSVD}
