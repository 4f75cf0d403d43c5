"""Baselines a growth strategy must beat (docs/mathematics.md §8). They take no step (λ = 0).

``random``: new columns of both factors drawn small at random (each ~1% of its own
factor's RMS entry, so the new part of ``Z`` is ~1e-4 of the old one whatever the balance
of ``W_Q`` and ``W_K``); if the loss is not finite at the draw, it is drawn 10× smaller,
then the new ``W_K`` columns are set to zero (recorded in ``fallback``);
``zero``: new ``W_Q`` columns random, new ``W_K`` columns zero (function preserved);
``gradmax``: new ``W_K`` columns zero, new ``W_Q`` columns the top-``p`` left singular
vectors of ``E[M] = ∂L/∂Z``, which maximise the gradient norm of the new ``W_K`` columns.

In all three the old columns are kept, rescaled by ``sqrt(c / c')`` so that
``c' W_Q' W_K'ᵀ`` still equals ``c W_Q W_Kᵀ`` on them.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ._checks import check_number, pow2_scale
from .growth import StepContext, Strategy, _host_reads, append_columns
from .registry import register
from .statistics import Statistics
from .timing import timed


def _rms(W: Tensor) -> float:
    """Root-mean-square entry of ``W`` (0 when empty), without squaring ``W`` itself.

    ``W.pow(2)`` overflows float32 for entries beyond ~1e19, which made the default
    ``std`` infinite and the new columns NaN. On ``W / 2^e`` (exact) it cannot, and the
    result is bit for bit the plain one wherever that did not overflow.
    """
    if W.numel() == 0:
        return 0.0
    s = pow2_scale(W)
    return float((W / s).pow(2).mean().sqrt() * s)


def _column_norms(W: Tensor) -> Tensor:
    """Euclidean norm of each column of ``W (d, k)``, on ``W / 2^e`` (exact) so that it cannot overflow."""
    s = pow2_scale(W)
    return torch.linalg.vector_norm(W / s, dim=0) * s


class Baseline(Strategy):
    """Shared by the baselines: statistics are the two Gram sums, the direction is ``E[M]``.

    Parameters
    ----------
    std : float, optional
        Standard deviation of random new entries; default ``0.01 ×`` the RMS entry of
        the existing factor they are appended to (``0.01 / sqrt(d_e)`` when ``d_k = 0``).
    seed : int
        Seed of the private generator of the random entries.
    """

    name: str = ""

    def __init__(self, std: float | None = None, seed: int = 0) -> None:
        check_number(f"{self.name} std", std, optional=True)
        check_number(f"{self.name} seed", seed, integer=True)
        if std is not None and not std > 0:
            raise ValueError(f"std must be > 0, got {std!r}")
        self.std = std
        self.seed = seed
        self.spec = self.name

    def new_statistics(self) -> Statistics:
        return Statistics(split_half=False)  # the plain gradient needs no half sums

    def _direction(self, stats: Statistics, log: list[str], info: dict) -> Tensor:
        # The plain gradient ∂L/∂Z: what a baseline would follow if it took a step.
        return stats.mean_M

    def _random(self, like: Tensor, d_e: int, p: int, W: Tensor, seed: int | None = None) -> Tensor:
        """``(d_e, p)`` normal entries of std ``self.std`` or ``0.01 · RMS(W)``, of ``like``'s dtype and device."""
        std = self.std
        if std is None:
            std = 0.01 * (_rms(W) if W.numel() else 1.0 / math.sqrt(d_e))
        gen = torch.Generator(device="cpu").manual_seed(self.seed if seed is None else seed)
        return (torch.randn(d_e, p, generator=gen, dtype=torch.float64) * std).to(like)

    def _step(self, ctx: StepContext, W_Q: Tensor, W_K: Tensor, stats: Statistics,
              p: int) -> tuple[Tensor, Tensor, float]:
        keep = math.sqrt(ctx.scale / ctx.new_scale)
        # No graph: the results are new weights, detached like a growth strategy's.
        with timed(ctx.timings, "direction", W_Q.device), torch.no_grad():
            new_Q, new_K = self._new_columns(W_Q, W_K, stats, p, keep)
            W_Q2, W_K2 = append_columns(ctx, W_Q, W_K, new_Q, new_K)
        _host_reads(ctx, self._column_reads(W_Q, W_K))
        ctx.timings.setdefault("line_search", 0.0)
        ctx.timings.setdefault("truncation", 0.0)
        return W_Q2, W_K2, 0.0

    def _new_columns(self, W_Q: Tensor, W_K: Tensor, stats: Statistics, p: int, keep: float) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def _column_reads(self, W_Q: Tensor, W_K: Tensor) -> int:
        """Numbers :meth:`_new_columns` reads on the host (the RMS entries that scale a random draw)."""
        return 0


@register("baseline")
class RandomGrowth(Baseline):
    """New columns of both ``W_Q`` and ``W_K`` drawn small at random.

    The only baseline that changes the function, so the only one whose loss can become
    NaN or Inf (a loss undefined beyond some scores, scores that overflow). It evaluates
    the loss at its draw; while that is not finite it shrinks the new columns tenfold
    (``max_shrink`` times), then sets the new ``W_K`` columns to zero, which keeps the
    function. Each step is recorded in ``fallback``.

    Parameters
    ----------
    std : float, optional
        See :class:`Baseline`.
    seed : int
        Seed of the ``W_Q`` draw; ``seed + 1`` seeds the ``W_K`` draw.
    max_shrink : int
        Tenfold shrinks tried before the zero fallback.
    """

    name = "random"

    def __init__(self, std: float | None = None, seed: int = 0, max_shrink: int = 4) -> None:
        super().__init__(std=std, seed=seed)
        if isinstance(max_shrink, bool) or not isinstance(max_shrink, int) or max_shrink < 0:
            raise ValueError(f"max_shrink must be a non-negative int, got {max_shrink!r}")
        self.max_shrink = max_shrink

    def _new_columns(self, W_Q, W_K, stats, p, keep):
        d_e = W_Q.shape[0]
        # Each factor's new columns at 1% of its own RMS: one shared std (W_Q's) made the new
        # part of Z as large as the old one, or overflowing, when W_Q and W_K differ in scale.
        # A different stream for W_K: the same draw would make Z's new part symmetric PSD.
        return self._random(W_Q, d_e, p, W_Q * keep), self._random(W_K, d_e, p, W_K * keep, seed=self.seed + 1)

    def _column_reads(self, W_Q, W_K):
        return 0 if self.std is not None else int(W_Q.numel() > 0) + int(W_K.numel() > 0)

    def _step(self, ctx, W_Q, W_K, stats, p):
        W_Q2, W_K2, lam = super()._step(ctx, W_Q, W_K, stats, p)
        d_k = W_Q.shape[1]
        with timed(ctx.timings, "line_search", W_Q.device), torch.no_grad():
            v = self._loss(ctx, W_Q2, W_K2)
            shrinks = 0
            while not math.isfinite(v) and shrinks < self.max_shrink:
                shrinks += 1
                W_Q2[:, d_k:] *= 0.1
                W_K2[:, d_k:] *= 0.1
                v = self._loss(ctx, W_Q2, W_K2)
            if shrinks:
                ctx.log.append(f"random: loss not finite at the drawn columns; shrank them {shrinks}× tenfold"
                               + ("" if math.isfinite(v) else "; still not finite"))
            if not math.isfinite(v):
                W_K2[:, d_k:] = 0.0
                v = self._loss(ctx, W_Q2, W_K2)
                ctx.log.append("random: new W_K columns set to zero (function kept, like the zero baseline)")
        ctx.loss_after = v
        return W_Q2, W_K2, lam

    @staticmethod
    def _loss(ctx: StepContext, W_Q: Tensor, W_K: Tensor) -> float:
        return float(ctx.loss(ctx.new_scale * (ctx.X @ W_Q) @ (ctx.X @ W_K).mT))


@register("baseline")
class ZeroGrowth(Baseline):
    """New ``W_Q`` columns random, new ``W_K`` columns zero: the function is unchanged."""

    name = "zero"

    def _new_columns(self, W_Q, W_K, stats, p, keep):
        return self._random(W_Q, W_Q.shape[0], p, W_Q * keep), W_K.new_zeros(W_K.shape[0], p)

    def _column_reads(self, W_Q, W_K):
        return int(self.std is None and W_Q.numel() > 0)


@register("baseline")
class GradMax(Baseline):
    """New ``W_K`` columns zero, new ``W_Q`` columns the top-``p`` left singular vectors of ``E[M]``.

    Parameters
    ----------
    norm : float, optional
        Norm of each new ``W_Q`` column; default the mean column norm of the
        (rescaled) existing ``W_Q``, or 1 when ``d_k = 0``.
    """

    name = "gradmax"

    def __init__(self, norm: float | None = None, seed: int = 0) -> None:
        super().__init__(seed=seed)
        check_number("gradmax norm", norm, optional=True)
        if norm is not None and not norm > 0:
            raise ValueError(f"norm must be > 0, got {norm!r}")
        self.norm = norm

    def _new_columns(self, W_Q, W_K, stats, p, keep):
        # Statistics of another dtype or device (accumulated in float64, say) follow the factors.
        U, _, _ = torch.linalg.svd(stats.mean_M.to(dtype=W_Q.dtype, device=W_Q.device))
        norm = self.norm
        if norm is None:
            norm = float(_column_norms(W_Q * keep).mean()) if W_Q.shape[1] else 1.0
        return U[:, :p] * norm, W_K.new_zeros(W_K.shape[0], p)

    def _column_reads(self, W_Q, W_K):
        return int(self.norm is None and W_Q.shape[1] > 0)

