"""How ``†`` / ``^{-1}`` is applied: the "pinv versus solve" axis (docs/mathematics.md §3).

Every component exposes the same two operations:

- ``factor(A, log, rtol=None, halves=None)`` factorises symmetric positive semi-definite Gram
  matrices ``A (..., d, d)`` once and returns an object that applies ``A^{-1}`` (or ``A^†``,
  or the ridge's ``(A + δI)^{-1}``) to right-hand sides, so the joint solver's preconditioner
  reuses one factorisation; ``halves`` are the gradient sums ``Σ M_b`` over the two halves of
  the samples, from which ``ridge`` chooses its strength (the others ignore them);
- ``data_sandwich(X, G, log)`` returns ``X^† G X^†ᵀ`` for data matrices
  ``X (..., d_s, d_e)``, ``G (..., d_s, d_s)``.

``log`` is a list to which every fallback is appended as a message: fallbacks are
recorded in results, never only warned about.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

import torch
from torch import Tensor

from ._checks import check_number
from .gram import PSDFactor, factor_psd
from .registry import register
from .timing import section

#: The ridge strengths ``α`` that ``ridge`` tries, as multiples of the mean eigenvalue of ``A`` (0: no ridge).
RIDGE_ALPHAS = (0.0, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0)
#: ``ridge``'s strength where no split-half statistics can choose one (per-sample and mean-input sandwiches,
#: the joint preconditioner): the middle of the range it chooses from on the suite's data.
RIDGE_FALLBACK_ALPHA = 1.0


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
        check_number("pinv rtol", rtol, optional=True)
        if rtol is not None and not (0 <= rtol < 1):
            raise ValueError(f"pinv rtol must be in [0, 1), got {rtol!r}")
        self.rtol = rtol

    def factor(self, A: Tensor, log: list[str], rtol: float | None = None, halves=None) -> GramFactor:
        """Pseudo-invert symmetric PSD ``A (..., d, d)`` by ``eigh`` (the SVD of a PSD matrix).

        ``rtol`` is the caller's default cutoff (used when the component has none); ``halves`` is ignored.
        """
        with section("factorisation"):
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
    #: :meth:`data_sandwich` reads one number on the host: how many of the batch's factorisations failed.
    data_sandwich_host_reads = 1

    def __init__(self, method: str = "cholesky", rtol: float | None = None) -> None:
        if method not in ("cholesky", "lu"):
            raise ValueError(f"solve method must be 'cholesky' or 'lu', got {method!r}")
        check_number("solve rtol", rtol, optional=True)
        if rtol is not None and not (0 <= rtol < 1):
            raise ValueError(f"solve rtol must be in [0, 1), got {rtol!r}")
        self.method = method
        self.rtol = rtol

    def factor(self, A: Tensor, log: list[str], rtol: float | None = None, halves=None) -> GramFactor:
        """Factorise symmetric PSD ``A (..., d, d)``; failures fall back to pinv and are logged.

        ``rtol`` is the caller's default cutoff (used when the component has none); ``halves`` is ignored.
        """
        with section("factorisation"):
            return _SolveFactor(A, self.method, self.rtol if self.rtol is not None else rtol, log)

    def data_sandwich(self, X: Tensor, G: Tensor, log: list[str], GX: Tensor | None = None) -> Tensor:
        """``(XᵀX)^{-1} XᵀGX (XᵀX)^{-1}``, equal to ``X^† G X^†ᵀ`` when ``X`` has full column rank.

        ``GX`` (``G @ X``, shape ``(..., d_s, d_e)``) may be passed when already computed.
        """
        GX = G @ X if GX is None else GX
        A = X.mT @ X
        M = X.mT @ GX
        return self.factor(A, log).sandwich(M)



class _RidgeFactor(GramFactor):
    """``(A + δI)^{-1}`` from ``A = V diag(w) Vᵀ``; with ``δ = 0``, the pseudo-inverse above a cutoff.

    ``w``: ``A``'s eigenvalues (clamped at 0); ``rotated_halves``: ``(Vᵀ M_a V, Vᵀ M_b V)`` (float64) of the halves
    the strength was chosen with, or None.
    """

    def __init__(self, w: Tensor, V: Tensor, inv_w: Tensor, alpha: float, host_syncs: int,
                 rotated_halves: tuple[Tensor, Tensor] | None = None) -> None:
        self.w, self.V, self.inv_w = w, V, inv_w
        self.alpha = alpha
        self.host_syncs = host_syncs
        self.rotated_halves = rotated_halves

    def solve(self, R: Tensor) -> Tensor:
        return self.V @ (self.inv_w.unsqueeze(-1) * (self.V.mT @ R))

    def rotated_sandwich(self, M_rotated: Tensor) -> Tensor:
        """``Vᵀ (A + δI)^{-1} M (A + δI)^{-1} V`` from ``Vᵀ M V`` ``(d, d)``, both in ``A``'s eigenbasis (the strength
        search's :attr:`rotated_halves`): entrywise, ``M̃_ij / ((w_i + δ)(w_j + δ))``, in ``V``'s dtype."""
        inv = self.inv_w
        return inv.unsqueeze(-1) * M_rotated.to(self.V.dtype) * inv.unsqueeze(-2)


@register("inverse")
class Ridge:
    """``(A + δI)^{-1}`` with ``δ = α · tr(A)/d``: a ridge that keeps weak directions of ``E[XᵀX]`` from
    amplifying the noise of a gradient estimated from few tokens (docs/mathematics.md §3.5).

    With ``alpha="auto"`` the strength is chosen from the data: of :data:`RIDGE_ALPHAS`, the one whose
    direction ``P(δ) = (A + δI)^{-1} M (A + δI)^{-1}`` has the highest *honest cosine* with the gradient,
    estimated by cross-fitting the two halves of the samples (``M_a``, ``M_b``): the direction of one half
    scored against the gradient of the other, ``2 ⟨M_a, P_b⟩ + 2 ⟨M_b, P_a⟩`` (the noise of a half is
    independent of the other half, so this is the in-sample slope without its optimism), divided by the
    direction's score-space norm ``‖X P Xᵀ‖ ≈ (n Σ_ij w_i w_j P̃_ij²)^{1/2}`` in ``A``'s eigenbasis. One
    ``eigh`` of ``A`` serves every candidate.

    Parameters
    ----------
    alpha : float or "auto"
        A fixed strength (``≥ 0``), or ``"auto"`` for the data's choice; where the caller has no
        split-half statistics (per-sample and mean-input sandwiches, the joint preconditioner)
        ``"auto"`` takes :data:`RIDGE_FALLBACK_ALPHA`, recorded in ``log``.
    rtol : float, optional
        With ``δ = 0``, eigenvalues below ``rtol · w_max`` are left out, as ``pinv`` does.
        Default ``d · eps(dtype)``.
    """

    name = "ridge"

    def __init__(self, alpha: float | str = "auto", rtol: float | None = None) -> None:
        if alpha != "auto" and (isinstance(alpha, bool) or not isinstance(alpha, int | float)
                                or not math.isfinite(alpha) or alpha < 0):
            raise ValueError(f"ridge alpha must be 'auto' or a finite number >= 0, got {alpha!r}")
        check_number("ridge rtol", rtol, optional=True)
        if rtol is not None and not (0 <= rtol < 1):
            raise ValueError(f"ridge rtol must be in [0, 1), got {rtol!r}")
        self.alpha = alpha
        self.rtol = rtol

    def factor(self, A: Tensor, log: list[str], rtol: float | None = None, halves=None) -> GramFactor:
        """Factorise ``A (..., d, d)`` with its ridge; ``halves`` ``(M_a, M_b)`` let ``alpha="auto"`` choose it.

        The chosen ``alpha`` and its honest cosine are the factor's ``alpha`` and ``cosine``.
        """
        with section("ridge strength"):  # the eigh serves the strength search and the solves
            w, V = torch.linalg.eigh(A)
            w = w.clamp_min(0)
            tol = self.rtol if self.rtol is not None else (rtol if rtol is not None
                                                           else default_rtol(A.dtype, A.shape[-1]))
            mean_w = w.mean(dim=-1, keepdim=True)
            alpha, cosine, syncs, rotated = self.alpha, math.nan, 0, None
            if alpha == "auto":
                if halves is not None and A.dim() == 2:
                    alpha, cosine, rotated = _honest_alpha(w, V, halves, tol)
                    syncs = 1
                else:
                    alpha = RIDGE_FALLBACK_ALPHA
                    what = "batched Gram matrices" if A.dim() > 2 else "this Gram matrix"
                    log.append(f"ridge: no split-half statistics for {what}; alpha = {alpha:g}")
            factor = _RidgeFactor(w, V, _ridge_inverse(w, alpha * mean_w, tol), float(alpha), syncs, rotated)
        factor.cosine = cosine
        return factor

    def data_sandwich(self, X: Tensor, G: Tensor, log: list[str], GX: Tensor | None = None) -> Tensor:
        """``(XᵀX + δI)^{-1} XᵀGX (XᵀX + δI)^{-1}`` per matrix, at the fixed (or fallback) strength."""
        GX = G @ X if GX is None else GX
        return self.factor(X.mT @ X, log).sandwich(X.mT @ GX)


def _ridge_inverse(w: Tensor, delta: Tensor, tol: float) -> Tensor:
    """``1 / (w + δ)``, with eigenvalues below ``tol · w_max`` left out where ``δ`` is 0."""
    lifted = w + delta
    keep = lifted > tol * w.amax(dim=-1, keepdim=True).clamp_min(torch.finfo(w.dtype).tiny)
    return torch.where(keep, 1.0 / torch.where(keep, lifted, torch.ones_like(lifted)), torch.zeros_like(lifted))


def _honest_alpha(w: Tensor, V: Tensor, halves: tuple[Tensor, Tensor],
                  tol: float) -> tuple[float, float, tuple[Tensor, Tensor]]:
    """The strength of :data:`RIDGE_ALPHAS` with the highest honest cosine (see :class:`Ridge`), that cosine, and
    the halves in ``A``'s eigenbasis, ``(Vᵀ M_a V, Vᵀ M_b V)`` in float64 (the direction is made from them).

    The halves are rotated in ``V``'s precision (an orthogonal rotation keeps their norms, so float32 rounds each
    entry at ``eps · ‖M‖``; float64 products took a tenth of a growth's floor at d_e = 1024) and scored in float64.
    In ``A``'s eigenbasis each candidate's two sums are quadratic forms in its ``1 / (w + δ)``:
    ``Σ_ij c_ij u_i u_j`` with ``c = M̃_a ∘ M̃_b`` and ``c = (w wᵀ) ∘ (M̃_a + M̃_b)²`` (on ``u²``), so the dozen
    candidates take two ``(k, d) @ (d, d)`` products instead of a dozen ``(d, d)`` temporaries each.
    """
    Ma, Mb = ((V.mT @ M.to(V) @ V).double() for M in halves)
    w64 = w.double()
    cross = Ma * Mb
    weighted = (w64[:, None] * w64[None, :]) * (Ma + Mb).square()
    alphas = torch.tensor(RIDGE_ALPHAS, dtype=w64.dtype, device=w64.device)
    inv = _ridge_inverse(w64[None, :], alphas[:, None] * w64.mean(), tol)  # (k, d): 1 / (w + δ) per candidate
    honest = 4 * ((inv @ cross) * inv).sum(dim=-1)  # 2⟨M_a, P_b⟩ + 2⟨M_b, P_a⟩, the two terms equal here
    norm = (((inv * inv) @ weighted) * (inv * inv)).sum(dim=-1).sqrt()
    values = torch.where(norm > 0, honest / norm, torch.full_like(norm, -math.inf)).tolist()  # one host transfer
    best = max(range(len(RIDGE_ALPHAS)), key=lambda i: values[i])
    return RIDGE_ALPHAS[best], values[best], (Ma, Mb)
