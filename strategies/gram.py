"""One factorisation of a positive semi-definite Gram matrix, shared by ``solve`` and the metric.

``E[A] = E[XᵀX]`` is singular in the common case, not the rare one: a ones column
appended to post-LayerNorm features (the normalised features sum to zero), fewer
tokens than features (``b · d_s < d_e``), or repeated tokens. An eigendecomposition
handles that but costs ten to thirty times a Cholesky factorisation on a GPU. So the
null directions are removed once, by design:

1. Cholesky of ``A + δ I`` with ``δ = rtol · max diag(A)`` (rounding level). It exists
   for any PSD ``A``. (Its pivots do not reveal the null space: a null direction spread
   over ``d`` coordinates leaves a pivot near ``d · δ``, no smaller than a weak real one.)
2. Two steps of inverse iteration with that factor on a block of 8 random vectors:
   ``(A + δI)^{-1}`` multiplies a null direction by ``1/δ`` and any other by at most
   ``1/λ``, so the block converges to the null space first. A Rayleigh–Ritz step keeps
   the directions whose Rayleigh quotient is below ``rtol · ‖A‖_F``: the orthonormal
   basis ``N``. A block that is null throughout is widened fourfold and run again.
   If nothing is null, the factor of step 1 is used as it is.
3. ``A + f N Nᵀ`` (the null directions lifted to ``f``, the rest untouched) is regular;
   its Cholesky factor ``L`` serves the callers:

   - the inverse: ``(A + f N Nᵀ)^{-1} R`` followed by the projection ``I − N Nᵀ`` is
     exactly ``A^† R`` for every ``R`` in the range of ``A``, the pseudo-inverse
     without an eigendecomposition;
   - the metric: any ``L`` with ``L Lᵀ = A + f N Nᵀ`` gives the same metric-aware
     truncation as its symmetric square root (see :mod:`strategies.truncation`).

Only when this fails (an indefinite matrix, more null directions than the block
caught) does a caller fall back to an eigendecomposition, and records that it did.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

#: First width of the inverse-iteration block; widened fourfold while every vector in it is null.
NULL_BLOCK = 8
#: Inverse-iteration steps (the null directions gain a factor ``λ_min / δ`` per step).
NULL_ITERATIONS = 2


@dataclass(frozen=True)
class PSDFactor:
    """``L Lᵀ = A + f N Nᵀ`` for a PSD ``A (d, d)`` whose null directions ``N (d, m)`` were lifted to ``f``.

    Attributes
    ----------
    L : Tensor
        Lower-triangular Cholesky factor, ``(d, d)``.
    null : Tensor
        Orthonormal basis of the numerically null directions of ``A``, ``(d, m)``; ``m = 0``
        when ``A`` is numerically regular.
    host_syncs : int
        Points at which the factorisation needed a number on the host (a count of null directions).
    """

    L: Tensor
    null: Tensor
    host_syncs: int

    @property
    def n_null(self) -> int:
        """Number of null directions removed."""
        return self.null.shape[1]

    def solve(self, R: Tensor) -> Tensor:
        """``(A + f N Nᵀ)^{-1} R`` for ``R (d, k)``."""
        return torch.cholesky_solve(R, self.L)

    def project(self, R: Tensor) -> Tensor:
        """``(I − N Nᵀ) R`` for ``R (d, k)``: the component in the range of ``A``."""
        if self.n_null == 0:
            return R
        return R - self.null @ (self.null.mT @ R)

    def pinv_sandwich(self, M: Tensor) -> Tensor:
        """``A^† M A^†`` for a symmetric ``M (d, d)``, through two solves and the projections."""
        left = self.project(self.solve(self.project(M)))
        return self.project(self.solve(left.mT)).mT


def factor_psd(A: Tensor, rtol: float, lift: float = 1.0, seed: int = 0) -> PSDFactor | None:
    """Factorise a symmetric PSD ``A (d, d)`` once, removing its null directions by design.

    Parameters
    ----------
    A : Tensor
        Symmetric positive semi-definite, ``(d, d)``.
    rtol : float
        Eigenvalues below ``rtol · ‖A‖_F`` are numerically zero.
    lift : float
        The null directions become eigenvalues ``lift · max diag(A)`` of the factorised
        matrix. Any positive value gives the same pseudo-inverse on the range of ``A``;
        the metric chooses ``sqrt(rtol)`` (see :class:`strategies.truncation.Metric`).
    seed : int
        Seed of the inverse-iteration block, so that results are reproducible.

    Returns
    -------
    PSDFactor or None
        None when no Cholesky factor could be made (the matrix is indefinite beyond
        rounding); the caller
        then falls back to an eigendecomposition and records it.
    """
    d = A.shape[-1]
    eye = torch.eye(d, dtype=A.dtype, device=A.device)
    # Not clamped above 0: for A = 0 a tiny jitter's solve overflows to inf; a zero one fails below, and says so.
    scale = A.diagonal().amax()
    jitter = rtol * scale
    null_cut = rtol * torch.linalg.matrix_norm(A)  # ‖A‖_F ≥ λ_max, like a pseudo-inverse's cutoff
    L, info = torch.linalg.cholesky_ex(A + jitter * eye)
    # A failed factor holds NaN, which would make the eigh below raise before the failure is read:
    # iterate with the identity instead (no host transfer), and let the count below say it failed.
    L = torch.where(info.ne(0), eye, L)
    gen = torch.Generator(device=A.device).manual_seed(seed)
    k, syncs = min(d, NULL_BLOCK), 0
    while True:
        block = torch.randn(d, k, generator=gen, dtype=A.dtype, device=A.device)
        for _ in range(NULL_ITERATIONS):
            block = torch.linalg.qr(torch.cholesky_solve(block, L)).Q
        ritz, vecs = torch.linalg.eigh(block.mT @ A @ block)
        # One host transfer answers both questions: did Cholesky fail, and how many directions are null.
        failed, m = (int(v) for v in torch.stack([info.ne(0).sum(), (ritz <= null_cut).sum()]).tolist())
        syncs += 1
        if failed:
            return None
        # A block entirely null may have missed some: widen it (d_s · b < d_e, repeated tokens).
        if m < k or k == d:
            break
        k = min(d, 4 * k)
    if m == 0:
        return PSDFactor(L, A.new_zeros(d, 0), syncs)
    null = block @ vecs[:, :m]  # eigh sorts ascending: the null Ritz vectors come first
    L2, info2 = torch.linalg.cholesky_ex(A + (lift * scale) * (null @ null.mT) + jitter * eye)
    syncs += 1
    if bool(info2.ne(0)):
        return None
    return PSDFactor(L2, null, syncs)
