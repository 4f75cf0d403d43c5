"""Baselines a growth strategy must beat (MATH §8). They take no step (λ = 0).

``random``: new columns of both factors drawn small at random;
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

from .growth import Strategy
from .statistics import Statistics
from .timing import timed


class Baseline(Strategy):
    """Shared by the baselines: statistics are the two Gram sums, the direction is ``E[M]``.

    Parameters
    ----------
    std : float, optional
        Standard deviation of random new entries; default ``0.01 ×`` the RMS entry of
        the existing factors (``0.01 / sqrt(d_e)`` when ``d_k = 0``).
    seed : int
        Seed of the private generator of the random entries.
    """

    name: str = ""

    def __init__(self, std: float | None = None, seed: int = 0) -> None:
        if std is not None and not std > 0:
            raise ValueError(f"std must be > 0, got {std!r}")
        self.std = std
        self.seed = seed
        self.spec = self.name

    def new_statistics(self) -> Statistics:
        return Statistics()

    def _direction(self, stats: Statistics, log: list[str], info: dict) -> Tensor:
        # The plain gradient ∂L/∂Z: what a baseline would follow if it took a step.
        return stats.mean_M

    def _random(self, like: Tensor, d_e: int, p: int, W: Tensor) -> Tensor:
        std = self.std
        if std is None:
            std = 0.01 * (float(W.pow(2).mean().sqrt()) if W.numel() else 1.0 / math.sqrt(d_e))
        gen = torch.Generator(device="cpu").manual_seed(self.seed)
        return (torch.randn(d_e, p, generator=gen, dtype=torch.float64) * std).to(like)

    def _step(self, ctx, W_Q, W_K, stats, p):
        keep = math.sqrt(ctx.scale / ctx.new_scale)
        with timed(ctx.timings, "direction", W_Q.device), torch.no_grad():
            new_Q, new_K = self._new_columns(W_Q, W_K, stats, p, keep)
        ctx.timings.setdefault("line_search", 0.0)
        ctx.timings.setdefault("truncation", 0.0)
        return torch.cat([W_Q * keep, new_Q], 1), torch.cat([W_K * keep, new_K], 1), 0.0

    def _new_columns(self, W_Q: Tensor, W_K: Tensor, stats: Statistics, p: int, keep: float) -> tuple[Tensor, Tensor]:
        raise NotImplementedError


class RandomGrowth(Baseline):
    """New columns of both ``W_Q`` and ``W_K`` drawn small at random."""

    name = "random"

    def _new_columns(self, W_Q, W_K, stats, p, keep):
        d_e = W_Q.shape[0]
        q = self._random(W_Q, d_e, p, W_Q * keep)
        # A different stream for W_K: the same draw would make Z's new part symmetric PSD.
        k = torch.Generator(device="cpu").manual_seed(self.seed + 1)
        std = float(q.std()) if q.numel() > 1 else 0.01
        return q, (torch.randn(d_e, p, generator=k, dtype=torch.float64) * std).to(W_K)


class ZeroGrowth(Baseline):
    """New ``W_Q`` columns random, new ``W_K`` columns zero: the function is unchanged."""

    name = "zero"

    def _new_columns(self, W_Q, W_K, stats, p, keep):
        return self._random(W_Q, W_Q.shape[0], p, W_Q * keep), W_K.new_zeros(W_K.shape[0], p)


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
        if norm is not None and not norm > 0:
            raise ValueError(f"norm must be > 0, got {norm!r}")
        self.norm = norm

    def _new_columns(self, W_Q, W_K, stats, p, keep):
        U, _, _ = torch.linalg.svd(stats.mean_M)
        norm = self.norm
        if norm is None:
            norm = float(torch.linalg.vector_norm(W_Q * keep, dim=0).mean()) if W_Q.shape[1] else 1.0
        return U[:, :p] * norm, W_K.new_zeros(W_K.shape[0], p)


BASELINES: dict[str, type] = {"random": RandomGrowth, "zero": ZeroGrowth, "gradmax": GradMax}
