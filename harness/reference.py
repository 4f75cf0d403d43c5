"""The reference growth problem: teacher–student attention on anisotropic inputs.

A teacher block with a larger ``d_k`` produces targets from inputs ``X ~ N(0, Σ)``,
``Σ`` a random SPD matrix of given condition number; a student block with a smaller
``d_k`` is trained briefly so that growth is measured at a trained point, then one
batch is captured: ``X`` as the projections see it, ``G = ∂L/∂S`` and the closure
``loss_of_scores``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from models.block import GrowableAttention


@dataclass
class GrowthProblem:
    """One captured batch of a student block, ready for ``strategy.grow``."""

    block: GrowableAttention
    X: Tensor  # (b, d_s, d_e) as the projections see it
    G: Tensor  # (b, d_s, d_s)
    mask: Tensor | None
    loss_of_scores: Callable[[Tensor], Tensor]
    scale: float
    W_Q: Tensor
    W_K: Tensor


def anisotropic_covariance(d: int, cond: float, gen: torch.Generator) -> Tensor:
    """A random SPD ``(d, d)`` matrix with eigenvalues geometric from 1 to ``1/cond``."""
    Q, _ = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))
    w = torch.logspace(0, -torch.log10(torch.tensor(float(cond))).item(), d, dtype=torch.float64)
    return (Q * w) @ Q.T


def reference_problem(
    b: int = 256,
    d_s: int = 128,
    d_e: int = 64,
    d_k: int = 8,
    teacher_d_k: int = 16,
    cond: float = 100.0,
    teacher_sharpness: float = 4.0,
    warmup_steps: int = 20,
    causal: bool = False,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> GrowthProblem:
    """Build, warm up and capture a teacher–student problem.

    Parameters
    ----------
    b, d_s, d_e, d_k : int
        Batch, sequence length, embedding width, student's query/key width.
    teacher_d_k : int
        Teacher's query/key width (the rank a grown student can recover).
    cond : float
        Condition number of the input covariance (anisotropy).
    teacher_sharpness : float
        Factor on the teacher's ``W_Q`` and ``W_K``: larger means peakier attention.
    warmup_steps : int
        Adam steps on the student before capturing.
    """
    gen = torch.Generator().manual_seed(seed)
    L = torch.linalg.cholesky(anisotropic_covariance(d_e, cond, gen))

    def sample() -> Tensor:
        return (torch.randn(b, d_s, d_e, generator=gen, dtype=torch.float64) @ L.T).to(dtype=dtype, device=device)

    teacher = GrowableAttention(d_e, teacher_d_k, causal=causal, generator=torch.Generator().manual_seed(seed + 1),
                                dtype=dtype, device=device)
    student = GrowableAttention(d_e, d_k, causal=causal, generator=torch.Generator().manual_seed(seed + 2),
                                dtype=dtype, device=device)
    # A sharper teacher (scores of order one), and a student that copies its values and
    # output so that only the scores differ.
    with torch.no_grad():
        teacher.heads[0].W_Q.mul_(teacher_sharpness)
        teacher.heads[0].W_K.mul_(teacher_sharpness)
        student.heads[0].W_V.copy_(teacher.heads[0].W_V)
        student.W_O.copy_(teacher.W_O)
    opt = torch.optim.Adam([student.heads[0].W_Q, student.heads[0].W_K], lr=1e-2)
    for _ in range(warmup_steps):
        Xw = sample()
        with torch.no_grad():
            Yw = teacher(Xw)
        opt.zero_grad()
        torch.nn.functional.mse_loss(student(Xw), Yw).backward()
        opt.step()
    X = sample()
    with torch.no_grad():
        target = teacher(X)

    def rest(Y: Tensor) -> Tensor:
        return torch.nn.functional.mse_loss(Y, target)

    with student.capture():
        rest(student(X)).backward()
    cap = student.captured(0)
    W_Q, W_K = student.factors(0)
    return GrowthProblem(student, cap.Xa, cap.G, cap.mask, student.loss_of_scores(rest, 0), student.scale(0), W_Q, W_K)
