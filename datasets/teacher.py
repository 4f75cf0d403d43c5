"""Teacher–student attention on anisotropic inputs (docs/mathematics.md §1, §11.1).

A fixed teacher :class:`~models.block.GrowableAttention` with a larger query/key width
``teacher_d_k`` and sharpened scores maps inputs ``X ~ N(0, Σ)`` to targets. The student
copies the teacher's values and output projection, so at initialisation the only mismatch
is in the scores and the optimum is known: a student whose ``Z = c W_Q W_Kᵀ`` equals the
teacher's reaches zero loss (docs/mathematics.md §1).

Two users share the pieces here (covariance, sampling, teacher, value copy):
:class:`TeacherDataset`, the ``teacher`` data set of the sweeps, and
:func:`reference_problem`, one captured batch of a briefly trained student (the
README's reference measurement, ``growbench example`` and the asv suites).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from growbench.models.block import GrowableAttention

from .base import Dataset, GrowthModel


def anisotropic_covariance(d: int, cond: float, gen: torch.Generator) -> Tensor:
    """A random SPD ``(d, d)`` float64 matrix, eigenvalues geometric from 1 to ``1/cond``, random rotation."""
    Q, _ = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))
    w = torch.logspace(0, -math.log10(cond), d, dtype=torch.float64)
    return (Q * w) @ Q.T


def anisotropic_inputs(b: int, d_s: int, chol: Tensor, gen: torch.Generator) -> Tensor:
    """Inputs ``X ~ N(0, Σ)`` with ``Σ = L Lᵀ``.

    Parameters
    ----------
    b, d_s : int
        Batch size and sequence length.
    chol : Tensor, (d_e, d_e) float64
        Cholesky factor ``L`` of ``Σ`` (of :func:`anisotropic_covariance`, say).
    gen : torch.Generator
        Source of the draw, on its own device: a CPU generator gives the same draw whatever ``chol``'s device.

    Returns
    -------
    Tensor, (b, d_s, d_e) float64, on ``chol``'s device
    """
    noise = torch.randn(b, d_s, chol.shape[0], generator=gen, dtype=torch.float64, device=gen.device)
    return noise.to(chol.device) @ chol.T


def sharpened_teacher(d_e: int, d_k: int, sharpness: float, *, causal: bool, generator: torch.Generator,
                      dtype: torch.dtype = torch.float64, device: torch.device | str | None = None
                      ) -> GrowableAttention:
    """A frozen one-head teacher block whose ``W_Q`` and ``W_K`` are multiplied by ``sharpness``.

    Parameters
    ----------
    d_e, d_k : int
        Embedding width and the teacher's query/key width (the rank of its ``Z``).
    sharpness : float
        Factor on ``W_Q`` and ``W_K`` (so ``Z`` scales by its square): larger means peakier attention.
    causal : bool
        Causal mask.
    generator : torch.Generator
        Source of the initialisation.

    Returns
    -------
    GrowableAttention
        Parameters without gradients; maps ``(b, d_s, d_e)`` to ``(b, d_s, d_e)``.
    """
    teacher = GrowableAttention(d_e, d_k, causal=causal, generator=generator, dtype=dtype, device=device)
    with torch.no_grad():
        teacher.heads[0].W_Q.mul_(sharpness)
        teacher.heads[0].W_K.mul_(sharpness)
    teacher.requires_grad_(False)
    return teacher


def copy_values_and_output(student: GrowableAttention, teacher: GrowableAttention) -> None:
    """Give every head of ``student`` the teacher's ``W_V`` and ``W_O / n_heads``, so only the scores differ.

    A row for the student's bias input stays zero (``b_O`` starts at zero), so any number of
    heads whose ``Z`` all equal the teacher's reproduces the teacher exactly.

    Parameters
    ----------
    student : GrowableAttention
        ``d_v`` equal to the teacher's; changed in place.
    teacher : GrowableAttention
        One head, no bias.
    """
    W_V = teacher.heads[0].W_V.detach()
    W_O = teacher.W_O.detach() / student.n_heads
    with torch.no_grad():
        for h in student.heads:
            h.W_V.zero_()
            h.W_V[: teacher.d_e].copy_(W_V)
        student.W_O.copy_(W_O.repeat(student.n_heads, 1))


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
    device_draw : bool, default False
        Draw the inputs with a generator on the device that computes the batches
        (:meth:`~Dataset.compute_on`), seeded like the CPU's. Without it the draw is the CPU
        generator's, the same values on every device; but at the scale set's d_e = 4096 one
        batch is 2^26 float64 draws, 1.4 s on one core here and 13 s on a busy GPU host, and a
        site needs about 38 batches. With it a GPU draws a batch in milliseconds, and its
        values are the GPU generator's, not the CPU's. On the CPU it changes nothing.

    Notes
    -----
    The student built by :meth:`build_model` has ``d_v = d_e`` per head (the teacher's
    width) and the teacher's values and output (:func:`copy_values_and_output`). Hence any
    number of heads whose ``Z`` all equal the teacher's reproduces the teacher exactly.
    """

    name = "teacher"
    kind = "synthetic"
    description = "teacher-student attention: fit a sharper, wider teacher block on anisotropic Gaussian inputs"
    defaults = {"teacher_d_k": 16, "teacher_sharpness": 4.0, "cond": 100.0, "causal": False, "device_draw": False}

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
        self.teacher = sharpened_teacher(self.d_e, o["teacher_d_k"], o["teacher_sharpness"], causal=self.causal,
                                         generator=self._generator("teacher"))
        self._device_copies: tuple[torch.device, Tensor, GrowableAttention] | None = None

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
        chol, teacher = self._on(self.compute_device)
        if self._options["device_draw"] and chol.device.type != "cpu":
            gen = torch.Generator(device=chol.device).manual_seed(gen.initial_seed())
        X = anisotropic_inputs(b, self.d_s, chol, gen)
        # Chunks bound the float64 (chunk, d_s, d_s) score tensors (about 128 MiB) for long sequences.
        chunk = max(1, 2**24 // (self.d_s * self.d_s))
        with torch.no_grad():
            Y = torch.cat([teacher(Xc) for Xc in X.split(chunk)])
        return X.float(), Y.float()

    def _on(self, device: torch.device) -> tuple[Tensor, GrowableAttention]:
        """The Cholesky factor and the teacher on ``device`` (copies kept for the next batch; the CPU originals
        stay where the reference problem and the student's copy of the values read them)."""
        if device.type == "cpu":
            return self._chol, self.teacher
        if self._device_copies is None or self._device_copies[0] != device:
            self._device_copies = (device, self._chol.to(device), copy.deepcopy(self.teacher).to(device))
        return self._device_copies[1], self._device_copies[2]

    def build_model(self, d_k: int, *, n_heads: int = 1, bias: bool = False, scale_policy: str = "rescale",
                    dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> GrowthModel:
        """Student with the teacher's values and output (see class notes); only its scores differ."""
        block = self._block(d_k, self._generator("model"), n_heads=n_heads, bias=bias, scale_policy=scale_policy,
                            dtype=dtype, device=device, d_v=self.teacher.d_v)
        copy_values_and_output(block, self.teacher)
        return GrowthModel(nn.Identity(), block, nn.Identity(), _mse)


# ------------------------------------------------------------------ reference problem
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
    # ``Y (b, d_s, d_e) -> loss``; picklable, unlike ``loss_of_scores``, so that the asv
    # suites can cache the problem and rebuild the closure as ``block.loss_of_scores(rest)``.
    rest: Callable[[Tensor], Tensor]


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
    """Build, warm up and capture a teacher–student problem (the README's reference measurement).

    The teacher and student are those of :class:`TeacherDataset`, but every draw comes
    from generators seeded by ``seed`` directly (inputs ``seed``, teacher ``seed + 1``,
    student ``seed + 2``), so that the reference numbers stay those recorded before the
    data sets existed. The student takes ``warmup_steps`` Adam steps on ``W_Q, W_K`` so
    that growth is measured at a trained point; then one fresh batch is captured.

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
        Adam steps on the student before capturing (0: capture at initialisation).
    causal : bool
        Causal mask in teacher and student.
    seed : int
        Seed of inputs, teacher and student.
    dtype, device
        Of both blocks and of the captured tensors; inputs are drawn in float64 on the CPU.

    Returns
    -------
    GrowthProblem
        ``X`` (b, d_s, d_e), ``G = ∂L/∂S`` (b, d_s, d_s) of the MSE to the teacher's output.
    """
    gen = torch.Generator().manual_seed(seed)
    chol = torch.linalg.cholesky(anisotropic_covariance(d_e, cond, gen))

    def sample() -> Tensor:
        return anisotropic_inputs(b, d_s, chol, gen).to(dtype=dtype, device=device)

    teacher = sharpened_teacher(d_e, teacher_d_k, teacher_sharpness, causal=causal,
                                generator=torch.Generator().manual_seed(seed + 1), dtype=dtype, device=device)
    student = GrowableAttention(d_e, d_k, causal=causal, generator=torch.Generator().manual_seed(seed + 2),
                                dtype=dtype, device=device)
    copy_values_and_output(student, teacher)
    opt = torch.optim.Adam([student.heads[0].W_Q, student.heads[0].W_K], lr=1e-2)
    for _ in range(warmup_steps):
        Xw = sample()
        with torch.no_grad():
            Yw = teacher(Xw)
        opt.zero_grad()
        nn.functional.mse_loss(student(Xw), Yw).backward()
        opt.step()
    X = sample()
    with torch.no_grad():
        rest = partial(nn.functional.mse_loss, target=teacher(X))
    with student.capture():
        rest(student(X)).backward()
    cap = student.captured(0)
    W_Q, W_K = student.factors(0)
    return GrowthProblem(student, cap.Xa, cap.G, cap.mask, student.loss_of_scores(rest, 0), student.scale(0),
                         W_Q, W_K, rest)
