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
        The residual reached ``tol``, or the energy estimate reached ``energy_tol``.
    energy_error : float
        Estimated relative error of the energy ``⟨x, 𝒜x⟩`` (NaN unless asked for):
        the last ``window`` energy increments over the energy so far.
    """

    iterations: int
    residual: float
    converged: bool
    energy_error: float = float("nan")


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
    energy_tol: float | None = None,
    window: int = 25,
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
    energy_tol : float, optional
        Also stop when the energy ``⟨x, 𝒜x⟩ = ⟨x, b⟩`` has settled: the sum of its last
        ``window`` increments ``α_k ⟨r_k, z_k⟩`` is at most ``energy_tol`` times the
        energy. From ``x = 0`` CG's energy rises monotonically to ``⟨x*, 𝒜x*⟩`` and the
        missing part equals the sum of all later increments, so the recent ones estimate
        it (Strakoš & Tichý's error estimate). Where the residual stalls (a semidefinite,
        badly conditioned operator) the energy, which is all a norm of the projection
        needs, is often exact to many digits.

    Notes
    -----
    For the joint operator ``𝒜 = T*T`` with ``b = T*G`` the energy is ``‖T x‖²``, the
    squared norm of the projected gradient's current approximation, a lower bound of
    ``‖ΠG‖²`` at every iteration.
    """
    x = torch.zeros_like(rhs)
    b_norm = torch.linalg.matrix_norm(rhs)
    if not b_norm > 0:
        return x, CGInfo(0, 0.0, True)
    r = rhs.clone()
    z = precondition(r)
    p = z.clone()
    rz = (r * z).sum()
    res = 1.0
    increments: list[float] = []
    energy = 0.0  # running sum of the increments: summing the list each iteration is quadratic

    def energy_error() -> float:
        if energy_tol is None or not increments:
            return float("nan")
        return sum(increments[-window:]) / energy if energy > 0 else float("nan")

    def settled(k: int) -> bool:
        return energy_tol is not None and k >= window and energy_error() <= energy_tol

    for k in range(1, maxiter + 1):
        Ap = op(p)
        pAp = (p * Ap).sum()
        if not pAp > 0:
            # The search direction lies in the operator's null space: nothing left to fit.
            return x, CGInfo(k - 1, res, res <= tol or settled(k - 1), energy_error())
        alpha = rz / pAp
        if energy_tol is not None:
            increments.append(float(alpha * rz))
            energy += increments[-1]
        x = x + alpha * p
        r = r - alpha * Ap
        res = float(torch.linalg.matrix_norm(r) / b_norm)
        if res <= tol or settled(k):
            return x, CGInfo(k, res, True, energy_error())
        z = precondition(r)
        rz_new = (r * z).sum()
        if not rz_new > 0:
            return x, CGInfo(k, res, res <= tol, energy_error())
        p = z + (rz_new / rz) * p
        rz = rz_new
    return x, CGInfo(maxiter, res, False, energy_error())
