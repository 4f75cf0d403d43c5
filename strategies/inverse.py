"""How ``†`` / ``^{-1}`` is applied: the "pinv versus solve" axis (docs/mathematics.md §3).

Both components expose the same two operations:

- ``factor(A, log)`` factorises symmetric positive semi-definite Gram matrices
  ``A (..., d, d)`` once and returns an object that applies ``A^{-1}`` (or ``A^†``)
  to right-hand sides, so the joint solver's preconditioner reuses one factorisation;
- ``data_sandwich(X, G, log)`` returns ``X^† G X^†ᵀ`` for data matrices
  ``X (..., d_s, d_e)``, ``G (..., d_s, d_s)``.

``log`` is a list to which every fallback is appended as a message: fallbacks are
recorded in results, never only warned about.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import Tensor

from .gram import PSDFactor, factor_psd
from .registry import register


def default_rtol(dtype: torch.dtype, n: int) -> float:
    """The default relative cutoff ``n · eps(dtype)``: below it, singular values are rounding noise."""
    return n * torch.finfo(dtype).eps


class GramFactor(ABC):
    """A factorised Gram matrix ``A (..., d, d)`` that applies ``A^{-1}`` (or ``A^†``)."""

    #: Null directions of ``A`` removed by design (not a fallback), see :mod:`strategies.gram`.
    null_dims: int = 0
    #: Points at which factorising needed a number on the host.
    host_syncs: int = 0

    @abstractmethod
    def solve(self, R: Tensor) -> Tensor:
        """Return ``A^{-1} R`` for ``R (..., d, m)``."""

    def sandwich(self, M: Tensor) -> Tensor:
        """Return ``A^{-1} M A^{-1}`` for ``M (..., d, d)`` (``A`` symmetric, so right = transposed left)."""
        return self.solve(self.solve(M).mT).mT


class _EigFactor(GramFactor):
    """``A^†`` through a symmetric eigendecomposition with a relative cutoff."""

    def __init__(self, A: Tensor, rtol: float | None) -> None:
        w, V = torch.linalg.eigh(A)
        tol = default_rtol(A.dtype, A.shape[-1]) if rtol is None else rtol
        keep = w > tol * w.amax(dim=-1, keepdim=True).clamp_min(torch.finfo(A.dtype).tiny)
        inv_w = torch.where(keep, 1.0 / torch.where(keep, w, torch.ones_like(w)), torch.zeros_like(w))
        # A^† is the method itself here (pinv), so forming it is not an avoidable inverse.
        self.A_pinv = (V * inv_w.unsqueeze(-2)) @ V.mT
        self.rank = keep.sum(dim=-1)

    def solve(self, R: Tensor) -> Tensor:
        return self.A_pinv @ R


@register("inverse")
class Pinv:
    """SVD-based pseudo-inverse with an explicit relative cutoff.

    Parameters
    ----------
    rtol : float, optional
        Singular values below ``rtol · σ_max`` of the matrix being inverted are
        treated as zero. Default ``max(shape) · eps(dtype)``, the level of rounding noise.
    """

    name = "pinv"

    def __init__(self, rtol: float | None = None) -> None:
        if rtol is not None and not (0 <= rtol < 1):
            raise ValueError(f"pinv rtol must be in [0, 1), got {rtol!r}")
        self.rtol = rtol

    def factor(self, A: Tensor, log: list[str], rtol: float | None = None) -> GramFactor:
        """Pseudo-invert symmetric PSD ``A (..., d, d)`` by ``eigh`` (the SVD of a PSD matrix).

        ``rtol`` is the caller's default cutoff (used when the component has none).
        """
        return _EigFactor(A, self.rtol if self.rtol is not None else rtol)

    def data_sandwich(self, X: Tensor, G: Tensor, log: list[str], GX: Tensor | None = None) -> Tensor:
        """``X^† G X^†ᵀ`` with ``X^†`` from the SVD of ``X (..., d_s, d_e)`` itself.

        Working on ``X`` rather than ``XᵀX`` avoids squaring its condition number.
        """
        rtol = default_rtol(X.dtype, max(X.shape[-2:])) if self.rtol is None else self.rtol
        Xp = torch.linalg.pinv(X, rtol=rtol)  # (..., d_e, d_s)
        return Xp @ G @ Xp.mT


class _SolveFactor(GramFactor):
    """Cholesky (or LU) factors of Gram matrices.

    One matrix under Cholesky (``gram``, ``mean-input``, the joint preconditioner) has its
    null directions removed by design (:func:`strategies.gram.factor_psd`): the solve is
    then exactly the pseudo-inverse on the range, with no eigendecomposition and no
    fallback. A batch (``per-sample``) or LU hands the singular matrices to pinv and
    records it.
    """

    def __init__(self, A: Tensor, method: str, rtol: float | None, log: list[str]) -> None:
        d = A.shape[-1]
        tol = default_rtol(A.dtype, d) if rtol is None else rtol
        #: The null directions removed by design (one matrix under Cholesky), see :mod:`strategies.gram`.
        self.psd: PSDFactor | None = factor_psd(A, tol) if method == "cholesky" and A.dim() == 2 else None
        if self.psd is not None:
            self.null_dims, self.host_syncs = self.psd.n_null, self.psd.host_syncs
            return
        self.host_syncs = 1  # counting the failed factorisations
        scale = A.diagonal(dim1=-2, dim2=-1).abs().amax(dim=-1).clamp_min(torch.finfo(A.dtype).tiny)
        self.method = method
        if method == "cholesky":
            L, info = torch.linalg.cholesky_ex(A)
            pivots = L.diagonal(dim1=-2, dim2=-1) ** 2
            self.factors = L
        else:
            LU, piv, info = torch.linalg.lu_factor_ex(A)
            pivots = LU.diagonal(dim1=-2, dim2=-1).abs()
            self.factors = (LU, piv)
        # A Cholesky/LU that "succeeds" with a pivot at rounding level is numerically singular:
        # its solve would amplify noise by 1/eps, so it is treated as a failure too.
        bad = (info != 0) | ~(pivots.amin(dim=-1) > tol * scale)
        self.bad = bad
        self.fallback: _EigFactor | None = None
        n_bad = int(bad.sum())
        if n_bad:
            n = bad.numel()
            self.fallback = _EigFactor(A[bad] if A.dim() > 2 else A, rtol)
            what = "singular or not positive definite" if method == "cholesky" else "singular"
            log.append(
                f"solve: {method} failed on {n_bad} of {n} Gram matrices ({what}); used pinv for those"
            )

    def solve(self, R: Tensor) -> Tensor:
        if self.psd is not None:
            return self.psd.project(self.psd.solve(self.psd.project(R)))
        if self.bad.dim() == 0 and bool(self.bad):
            return self.fallback.solve(R)
        if self.method == "cholesky":
            out = torch.cholesky_solve(R, self.factors)
        else:
            out = torch.linalg.lu_solve(*self.factors, R)
        if self.fallback is not None:
            out = out.clone()
            out[self.bad] = self.fallback.solve(R[self.bad] if R.dim() > 2 else R)
        return out

    def sandwich(self, M: Tensor) -> Tensor:
        if self.psd is not None:
            return self.psd.pinv_sandwich(M)
        return super().sandwich(M)


@register("inverse")
class Solve:
    """Cholesky or LU solve, never forming the inverse.

    A single singular Gram matrix under Cholesky has its null directions removed once
    (the result is the pseudo-inverse on its range, counted in ``info["null_directions"]``);
    where that fails, and for batches of matrices, singular ones go to pinv, recorded.

    Parameters
    ----------
    method : {"cholesky", "lu"}
        Factorisation of the Gram matrices (all symmetric PSD here, so Cholesky is the
        natural choice; LU is kept for comparison).
    rtol : float, optional
        A matrix whose smallest pivot is below ``rtol`` times its largest diagonal entry
        is treated as singular and handed to pinv with the same cutoff. Default
        ``d · eps(dtype)``.
    """

    name = "solve"

    def __init__(self, method: str = "cholesky", rtol: float | None = None) -> None:
        if method not in ("cholesky", "lu"):
            raise ValueError(f"solve method must be 'cholesky' or 'lu', got {method!r}")
        if rtol is not None and not (0 <= rtol < 1):
            raise ValueError(f"solve rtol must be in [0, 1), got {rtol!r}")
        self.method = method
        self.rtol = rtol

    def factor(self, A: Tensor, log: list[str], rtol: float | None = None) -> GramFactor:
        """Factorise symmetric PSD ``A (..., d, d)``; failures fall back to pinv and are logged.

        ``rtol`` is the caller's default cutoff (used when the component has none).
        """
        return _SolveFactor(A, self.method, self.rtol if self.rtol is not None else rtol, log)

    def data_sandwich(self, X: Tensor, G: Tensor, log: list[str], GX: Tensor | None = None) -> Tensor:
        """``(XᵀX)^{-1} XᵀGX (XᵀX)^{-1}``, equal to ``X^† G X^†ᵀ`` when ``X`` has full column rank.

        ``GX`` (``G @ X``, shape ``(..., d_s, d_e)``) may be passed when already computed.
        """
        GX = G @ X if GX is None else GX
        A = X.mT @ X
        M = X.mT @ GX
        return self.factor(A, log).sandwich(M)

