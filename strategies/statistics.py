"""Streaming statistics of ``(X, G)`` over any number of batches.

The base class keeps ``Σ_b A_b = Σ_b X_bᵀ X_b`` and ``Σ_b M_b = Σ_b X_bᵀ G_b X_b``
(two ``(d_e, d_e)`` matrices) and the sample count: memory independent of the number
of samples. Every strategy needs them (``E[M]`` is the plain gradient ``∂L/∂Z``,
``E[A]`` the metric of metric-aware truncation). Averaging formulas that need more
extend it in :mod:`strategies.averaging`.

Precision: the first batch fixes the statistics' dtype and device, float32 for
float16/bfloat16 batches (:func:`strategies._checks.compute_dtype`); later batches are
converted to them, so batches of mixed dtypes accumulate in one precision.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._checks import check_batch, compute_dtype
from .timing import timed


class Statistics:
    """Running sums over samples; ``update`` once per batch.

    Attributes
    ----------
    n : int
        Number of samples (sequences) seen.
    sum_A, sum_M : Tensor
        ``Σ_b X_bᵀ X_b`` and ``Σ_b X_bᵀ G_b X_b``, each ``(d_e, d_e)``, in the dtype and on
        the device of the first batch (float32 for a float16/bfloat16 one).
    elapsed : float
        Seconds spent in ``update`` (synchronised on CUDA).
    log : list of str
        Fallbacks that happened while accumulating.
    """

    def __init__(self) -> None:
        self.n = 0
        self.sum_A: Tensor | None = None
        self.sum_M: Tensor | None = None
        self.elapsed = 0.0
        self.log: list[str] = []
        self._timings: dict[str, float] = {}

    def update(self, X: Tensor, G: Tensor, mask: Tensor | None = None) -> Statistics:
        """Accumulate one batch.

        Parameters
        ----------
        X : Tensor
            Inputs as the projections see them, ``(b, d_s, d_e)``. After the first batch,
            converted to the statistics' dtype and device.
        G : Tensor
            ``∂L/∂S``, ``(b, d_s, d_s)``; entries outside ``mask`` are treated as zero.
        mask : Tensor, optional
            Bool ``(d_s, d_s)`` or ``(b, d_s, d_s)``, True where attended.

        Returns
        -------
        Statistics
            ``self``, so calls can be chained.

        Raises
        ------
        ValueError
            Bad input (:func:`strategies._checks.check_batch`), or a ``d_e`` other than
            the statistics'.
        """
        return self._add(X, G, check_batch(X, G, mask))

    def _add(self, X: Tensor, G: Tensor, mask: Tensor | None) -> Statistics:
        """``update`` on a batch already validated by :func:`check_batch` (a growth checks it once)."""
        if self.sum_A is not None and X.shape[-1] != self.sum_A.shape[-1]:
            raise ValueError(
                f"batch has d_e={X.shape[-1]}, {X.dtype} on {X.device} but the statistics hold "
                f"d_e={self.sum_A.shape[-1]}, {self.sum_A.dtype} on {self.sum_A.device}"
            )
        # One precision and device for every sum: the first batch's (float32 for half
        # precision, which torch cannot factorise), so that mixed batches add up instead of
        # failing inside torch with a dtype error.
        if self.sum_A is None:
            dtype, device = compute_dtype(X.dtype), X.device
        else:
            dtype, device = self.sum_A.dtype, self.sum_A.device
        X, G = X.to(device=device, dtype=dtype), G.to(device=device, dtype=dtype)
        mask = None if mask is None else mask.to(device)
        with timed(self._timings, "update", X.device), torch.no_grad():
            if mask is not None:
                G = G.masked_fill(~mask, 0.0)
            d_e = X.shape[-1]
            GX = G @ X  # (b, d_s, d_e)
            Xf = X.reshape(-1, d_e)
            # One GEMM over the flattened batch instead of b small ones.
            A = Xf.mT @ Xf
            M = Xf.mT @ GX.reshape(-1, d_e)
            if self.sum_A is None:
                self.sum_A, self.sum_M = A, M
            else:
                self.sum_A = self.sum_A + A
                self.sum_M = self.sum_M + M
            self._accumulate(X, G, GX, mask)
            self.n += X.shape[0]
        self.elapsed = self._timings["update"]
        return self

    def _accumulate(self, X: Tensor, G: Tensor, GX: Tensor, mask: Tensor | None) -> None:
        """Hook for subclasses that keep more than the two Gram sums."""

    def _require(self) -> None:
        if self.n == 0:
            raise ValueError("statistics are empty: call update(X, G) with at least one batch first")

    @property
    def mean_A(self) -> Tensor:
        """``E[XᵀX]``, ``(d_e, d_e)``."""
        self._require()
        return self.sum_A / self.n

    @property
    def mean_M(self) -> Tensor:
        """``E[XᵀGX]``, ``(d_e, d_e)``: the mean gradient with respect to ``Z``."""
        self._require()
        return self.sum_M / self.n
