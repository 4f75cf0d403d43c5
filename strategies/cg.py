"""Matrix-free preconditioned conjugate gradients for the joint normal equations (docs/mathematics.md §2–3).

The operator is ``P ↦ E_b[ X_bᵀ (mask_b ⊙ X_b P X_bᵀ) X_b ]`` (``E_b[A_b P A_b]`` without
a mask); it is self-adjoint and positive semi-definite in the Frobenius inner product.
The loop is written in torch rather than calling ``scipy.sparse.linalg.cg`` so that it
stays on the tensors' device (CUDA) with no host round-trip per iteration.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class CGInfo:
    """How a CG solve ended.

    Attributes
    ----------
    iterations : int
    residual : float
        Relative residual ``‖b − 𝒜x‖ / ‖b‖``.
    converged : bool
        The residual reached ``tol``.
    """

    iterations: int
    residual: float
    converged: bool


def joint_operator(X: Tensor, mask: Tensor | None) -> Callable[[Tensor], Tensor]:
    """Return ``P ↦ (1/N) Σ_b X_bᵀ (mask_b ⊙ X_b P X_bᵀ) X_b`` for ``X (N, d_s, d_e)``.

    Without a mask and with ``d_e ≤ d_s`` the Gram matrices ``A_b (N, d_e, d_e)`` are
    formed once and each application is ``Σ_b (A_b P) A_b`` as one GEMM of
    ``(d_e, N·d_e) @ (N·d_e, d_e)``.
    """
    N, d_s, d_e = X.shape
    if mask is None and d_e <= d_s:
        A = X.mT @ X  # (N, d_e, d_e)
        A_stack = A.reshape(N * d_e, d_e)

        def op(P: Tensor) -> Tensor:
            AP = A @ P  # (N, d_e, d_e)
            return AP.transpose(0, 1).reshape(d_e, N * d_e) @ A_stack / N

        return op

    X_stack = X.reshape(N * d_s, d_e)

    def op_masked(P: Tensor) -> Tensor:
        Y = (X @ P) @ X.mT  # (N, d_s, d_s)
        if mask is not None:
            Y = Y * mask
        XtY = X.mT @ Y  # (N, d_e, d_s)
        return XtY.transpose(0, 1).reshape(d_e, N * d_s) @ X_stack / N

    return op_masked


def pcg(
    op: Callable[[Tensor], Tensor],
    rhs: Tensor,
    precondition: Callable[[Tensor], Tensor],
    tol: float = 1e-6,
    maxiter: int = 200,
) -> tuple[Tensor, CGInfo]:
    """Solve ``op(P) = rhs`` by preconditioned CG from ``P = 0``.

    From ``P = 0`` the first iterate is a multiple of ``precondition(rhs)``: with the
    preconditioner ``R ↦ E[A]^{-1} R E[A]^{-1}`` that is formula 2.

    Parameters
    ----------
    op, precondition : callable
        ``(d, d) -> (d, d)`` self-adjoint PSD maps.
    rhs : Tensor
        ``(d, d)``.
    tol : float
        Stop when ``‖rhs − op(P)‖_F ≤ tol · ‖rhs‖_F`` (recursive residual).
    maxiter : int
        Iteration cap.

    Notes
    -----
    For the joint operator ``𝒜 = T*T`` with ``b = T*G`` the energy ``⟨x, 𝒜x⟩ = ‖T x‖²`` rises
    at every iteration to ``‖ΠG‖²``: a solve stopped early gives a lower bound of it.
    """
    reads = 1  # host reads, one per decision below: the info's ``host_reads`` attribute (not a field: it is stored)
    x = torch.zeros_like(rhs)
    b_norm = torch.linalg.matrix_norm(rhs)
    if not b_norm > 0:
        return x, _ended(CGInfo(0, 0.0, True), reads)
    r = rhs.clone()
    z = precondition(r)
    p = z.clone()
    rz = (r * z).sum()
    res = 1.0
    for k in range(1, maxiter + 1):
        Ap = op(p)
        pAp = (p * Ap).sum()
        reads += 1
        if not pAp > 0:
            # The search direction lies in the operator's null space: nothing left to fit.
            return x, _ended(CGInfo(k - 1, res, res <= tol), reads)
        alpha = rz / pAp
        x = x + alpha * p
        r = r - alpha * Ap
        res = float(torch.linalg.matrix_norm(r) / b_norm)
        reads += 1
        if res <= tol:
            return x, _ended(CGInfo(k, res, True), reads)
        z = precondition(r)
        rz_new = (r * z).sum()
        reads += 1
        if not rz_new > 0:
            return x, _ended(CGInfo(k, res, res <= tol), reads)
        p = z + (rz_new / rz) * p
        rz = rz_new
    return x, _ended(CGInfo(maxiter, res, False), reads)


def _ended(info: CGInfo, reads: int) -> CGInfo:
    """``info`` with ``host_reads``: the numbers the solve read on the host (on a GPU, a synchronisation each).

    An attribute, not a field: :class:`CGInfo` is stored with cached reference projections, whose field set is
    checked when they are read back."""
    info.host_reads = reads
    return info
