"""Teacher–student attention on anisotropic inputs (the seed author's own setting).

A fixed teacher :class:`~models.block.GrowableAttention` with a larger query/key width
``teacher_d_k`` and sharpened scores maps inputs ``X ~ N(0, Σ)`` to targets. The student
copies the teacher's values and output projection, so at initialisation the only mismatch
is in the scores and the optimum is known: a student whose ``Z = c W_Q W_Kᵀ`` equals the
teacher's reaches zero loss (MATH.md §1).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from models.block import GrowableAttention

from .base import Dataset, GrowthModel


def anisotropic_covariance(d: int, cond: float, gen: torch.Generator) -> Tensor:
    """A random SPD ``(d, d)`` float64 matrix, eigenvalues geometric from 1 to ``1/cond``, random rotation."""
    Q, _ = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))
    w = torch.logspace(0, -math.log10(cond), d, dtype=torch.float64)
    return (Q * w) @ Q.T


def _mse(pred: Tensor, target: Tensor) -> Tensor:
    return nn.functional.mse_loss(pred, target)


class TeacherDataset(Dataset):
    """Teacher–student attention: targets are a sharper, wider teacher block's outputs.

    Inputs ``(b, d_s, d_e)`` float32, ``X ~ N(0, Σ)``; targets ``(b, d_s, d_e)`` float32,
    ``teacher(X)`` computed in float64. Infinite data: every ``index`` is a fresh draw.
    The model is ``identity -> block -> identity`` with MSE loss (mean over all entries).

    Options
    -------
    teacher_d_k : int, default 16
        Teacher's query/key width; its ``Z`` has rank ``min(teacher_d_k, d_e)``.
    teacher_sharpness : float, default 4.0
        Factor on the teacher's ``W_Q`` and ``W_K`` (so ``Z`` scales by its square):
        larger means peakier attention.
    cond : float, default 100.0
        Condition number of ``Σ`` (eigenvalues geometric from 1 to ``1/cond``).
    causal : bool, default False
        Causal mask in teacher and student.

    Notes
    -----
    The student built by :meth:`build_model` has ``d_v = d_e`` per head (the teacher's
    width) and copies the teacher's ``W_V`` into every head and ``W_O / n_heads`` into every
    head's block of ``W_O`` (a zero row for the bias input, ``b_O = 0``). Hence any number
    of heads whose ``Z`` all equal the teacher's reproduces the teacher exactly.
    """

    name = "teacher"
    description = "teacher-student attention: fit a sharper, wider teacher block on anisotropic Gaussian inputs"
    defaults = {"teacher_d_k": 16, "teacher_sharpness": 4.0, "cond": 100.0, "causal": False}

    def __init__(self, d_e: int, d_s: int, seed: int = 0, **options: Any) -> None:
        super().__init__(d_e, d_s, seed, **options)
        o = self._options
        if self.d_e < 2:
            raise ValueError(f"teacher: d_e must be >= 2, got {self.d_e}")
        if o["teacher_d_k"] < 1:
            raise ValueError(f"teacher: teacher_d_k must be >= 1, got {o['teacher_d_k']}")
        if o["teacher_sharpness"] <= 0:
            raise ValueError(f"teacher: teacher_sharpness must be > 0, got {o['teacher_sharpness']}")
        if o["cond"] < 1:
            raise ValueError(f"teacher: cond must be >= 1, got {o['cond']}")
        self.causal = o["causal"]
        sigma = anisotropic_covariance(self.d_e, o["cond"], self._generator("covariance"))
        self._chol = torch.linalg.cholesky(sigma)  # (d_e, d_e), X = N(0, I) @ L^T
        # float64 so that targets are exact to float32 rounding and float64 students can reach ~0 loss.
        self.teacher = GrowableAttention(self.d_e, o["teacher_d_k"], causal=self.causal,
                                         generator=self._generator("teacher"), dtype=torch.float64)
        with torch.no_grad():
            self.teacher.heads[0].W_Q.mul_(o["teacher_sharpness"])
            self.teacher.heads[0].W_K.mul_(o["teacher_sharpness"])
        self.teacher.requires_grad_(False)

    @property
    def covariance(self) -> Tensor:
        """Input covariance ``Σ``, (d_e, d_e) float64."""
        return self._chol @ self._chol.T

    def teacher_Z(self) -> Tensor:
        """The teacher's ``Z = c W_Q W_Kᵀ``.

        Returns
        -------
        Tensor, (d_e, d_e) float64
            Rank ``min(teacher_d_k, d_e)``.
        """
        W_Q, W_K = self.teacher.factors(0)
        return self.teacher.scale(0) * W_Q @ W_K.T

    def teacher_factors(self, scale: float | None = None, bias: bool = False,
                        width: int | None = None) -> tuple[Tensor, Tensor]:
        """Factors ``(W_Q, W_K)`` with ``scale · W_Q W_Kᵀ = teacher_Z()``, ready for ``block.install``.

        Parameters
        ----------
        scale : float, optional
            Score scale ``c`` of the receiving head after the install; defaults to the
            teacher's ``1/sqrt(teacher_d_k)``, which is what ``rescale`` gives when
            ``width`` is ``teacher_d_k``.
        bias : bool
            Append a zero row for the ones column of a ``bias=True`` block.
        width : int, optional
            Pad with zero columns up to this many (for a head already wider than the
            teacher); never truncates.

        Returns
        -------
        tuple[Tensor, Tensor]
            Each (d_e + bias, max(teacher_d_k, width)), float64.
        """
        W_Q, W_K = self.teacher.factors(0)
        c_t = self.teacher.scale(0)
        r = math.sqrt(c_t / (scale if scale is not None else c_t))
        W_Q, W_K = W_Q * r, W_K * r
        pad_cols = max(0, (width or 0) - W_Q.shape[1])
        W_Q, W_K = (nn.functional.pad(W, (0, pad_cols, 0, int(bias))) for W in (W_Q, W_K))
        return W_Q, W_K

    def batch(self, b: int, split: str = "train", index: int = 0) -> tuple[Tensor, Tensor]:
        """``(X, teacher(X))``, both (b, d_s, d_e) float32; see :meth:`Dataset.batch`."""
        self._check_batch_args(b, split, index)
        gen = self._generator("data", split, index)
        X = torch.randn(b, self.d_s, self.d_e, generator=gen, dtype=torch.float64) @ self._chol.T
        # Chunks bound the float64 (chunk, d_s, d_s) score tensors (about 128 MiB) for long sequences.
        chunk = max(1, 2**24 // (self.d_s * self.d_s))
        with torch.no_grad():
            Y = torch.cat([self.teacher(Xc) for Xc in X.split(chunk)])
        return X.float(), Y.float()

    def build_model(self, d_k: int, *, n_heads: int = 1, bias: bool = False, scale_policy: str = "rescale",
                    dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> GrowthModel:
        """Student with the teacher's values and output (see class notes); only its scores differ."""
        block = self._block(d_k, self._generator("model"), n_heads=n_heads, bias=bias, scale_policy=scale_policy,
                            dtype=dtype, device=device, d_v=self.teacher.d_v)
        W_V = self.teacher.heads[0].W_V.detach()
        W_O = self.teacher.W_O.detach() / n_heads
        with torch.no_grad():
            for h in block.heads:
                h.W_V.zero_()
                h.W_V[: self.d_e].copy_(W_V)
            block.W_O.copy_(W_O.repeat(n_heads, 1))
        return GrowthModel(nn.Identity(), block, nn.Identity(), _mse)
