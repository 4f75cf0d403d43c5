"""In-context linear regression (docs/mathematics.md §11.2; von Oswald et al. 2023).

Each sequence is its own regression task: ``w ~ N(0, I_d)``, ``x_i ~ N(0, I_d)``,
``y_i = wᵀx_i + ε_i`` with ``ε_i ~ N(0, σ²)``. The ``N = d_s - 1`` context tokens are
``(x_i, y_i)`` and the last token is the query ``(x_q, 0)``; ``d_e = d + 1``. The model must
predict ``y_q`` from the query token's ``y`` slot of the block output.

Known optimum of one-step gradient descent
-------------------------------------------
A linear self-attention layer (no softmax) with ``Z = [[I_d, 0], [0, 0]]`` and
``W_V W_O = (η/N) e_y e_yᵀ`` outputs, in the query's ``y`` slot, the prediction of one GD
step from ``w = 0`` on ``½ Σ_i (y_i - wᵀx_i)²`` with step ``η/N``:
``ŷ = (η/N) Σ_i y_i x_iᵀ x_q`` (the query's own value is 0, the residual adds its 0).

With ``h = (1/N) Σ_i y_i x_i = Ŝ w + (1/N) Σ_i ε_i x_i``, ``Ŝ = (1/N) Σ_i x_i x_iᵀ`` and
``E[Ŝ²] = (N + d + 1)/N · I`` (Wishart: ``E[x xᵀ x xᵀ] = (d + 2) I``), the expected loss is

    L(η) = E[(y_q - η hᵀx_q)²] = d - 2ηd + η² d (N + d + 1 + σ²)/N + σ²,

minimised at

    η* = N / (N + d + 1 + σ²),    L(η*) = d (d + 1 + σ²) / (N + d + 1 + σ²) + σ²,

against ``E[y_q²] = d + σ²`` for the trivial prediction 0.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .base import Dataset, GrowthModel


class QueryY(nn.Module):
    """Head: the ``y`` slot (last feature) of the query (last) token, ``(b, d_s, d_e) -> (b,)``."""

    def forward(self, Y: Tensor) -> Tensor:
        """Return ``Y[:, -1, -1]``."""
        return Y[:, -1, -1]


def _mse(pred: Tensor, target: Tensor) -> Tensor:
    return nn.functional.mse_loss(pred, target)


class ICLRegressionDataset(Dataset):
    """In-context linear regression: predict ``y_q`` from ``(x_i, y_i)_{i<d_s}`` and ``x_q``.

    Inputs ``(b, d_s, d_e)`` float32 (tokens ``[x_i | y_i]``, query ``[x_q | 0]`` last);
    targets ``(b,)`` float32, ``y_q`` (noisy like the context). ``d = d_e - 1`` features,
    ``N = d_s - 1`` context points. Infinite data. Model ``identity -> block -> QueryY``,
    MSE loss. See the module docstring for the one-step-GD optimum.

    Options
    -------
    noise : float, default 0.0
        Standard deviation ``σ`` of the label noise ``ε``.
    """

    name = "icl-regression"
    kind = "synthetic"
    description = "in-context linear regression: tokens (x_i, w.x_i), predict y of a query token"
    defaults = {"noise": 0.0}

    def __init__(self, d_e: int, d_s: int, seed: int = 0, **options: Any) -> None:
        super().__init__(d_e, d_s, seed, **options)
        if self.d_e < 2:
            raise ValueError(f"icl-regression: d_e = d_x + 1 must be >= 2 (at least one feature), got {self.d_e}")
        if self.d_s < 2:
            raise ValueError(f"icl-regression: d_s must be >= 2 (a context point and the query), got {self.d_s}")
        if self._options["noise"] < 0:
            raise ValueError(f"icl-regression: noise must be >= 0, got {self._options['noise']}")
        self.d_x = self.d_e - 1
        self.n_context = self.d_s - 1

    def batch(self, b: int, split: str = "train", index: int = 0) -> tuple[Tensor, Tensor]:
        """Inputs (b, d_s, d_e) and targets (b,), float32; see :meth:`Dataset.batch`."""
        self._check_batch_args(b, split, index)
        gen = self._generator("data", split, index)
        f64 = torch.float64
        w = torch.randn(b, self.d_x, generator=gen, dtype=f64)
        x = torch.randn(b, self.d_s, self.d_x, generator=gen, dtype=f64)
        y = torch.einsum("bsd,bd->bs", x, w)
        if self._options["noise"] > 0:
            y = y + self._options["noise"] * torch.randn(b, self.d_s, generator=gen, dtype=f64)
        target = y[:, -1].clone()
        y[:, -1] = 0.0  # the query's label is what is asked for
        return torch.cat([x, y.unsqueeze(-1)], dim=-1).float(), target.float()

    def build_model(self, d_k: int, *, n_heads: int = 1, bias: bool = False, scale_policy: str = "rescale",
                    dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> GrowthModel:
        """``identity -> block -> QueryY`` with MSE; the block is initialised from ``seed``."""
        block = self._block(d_k, self._generator("model"), n_heads=n_heads, bias=bias, scale_policy=scale_policy,
                            dtype=dtype, device=device)
        return GrowthModel(nn.Identity(), block, QueryY(), _mse)

    # ------------------------------------------------------------- known optimum
    def gd_prediction(self, inputs: Tensor, eta: float) -> Tensor:
        """Prediction of one GD step from ``w = 0``: ``ŷ = (η/N) Σ_i y_i x_iᵀ x_q``.

        Parameters
        ----------
        inputs : Tensor, (b, d_s, d_e)
            A batch from :meth:`batch` (the query token last).
        eta : float
            Step size ``η`` (per mean-squared loss, hence the ``1/N``).

        Returns
        -------
        Tensor, (b,)
            In the dtype of ``inputs``.
        """
        x, y = inputs[..., :-1], inputs[..., -1]
        ctx_x, ctx_y, xq = x[:, :-1], y[:, :-1], x[:, -1]
        return (eta / self.n_context) * torch.einsum("bn,bnd,bd->b", ctx_y, ctx_x, xq)

    def gd_expected_loss(self, eta: float) -> float:
        """Expected squared error of :meth:`gd_prediction` at step ``eta``.

        ``L(η) = d - 2ηd + η² d (N + d + 1 + σ²)/N + σ²`` (module docstring).
        """
        d, N, s2 = self.d_x, self.n_context, self._options["noise"] ** 2
        return d - 2 * eta * d + eta**2 * d * (N + d + 1 + s2) / N + s2

    def optimal_eta_and_loss(self) -> tuple[float, float]:
        """Closed-form optimal one-step-GD step and its expected loss.

        Returns
        -------
        tuple[float, float]
            ``η* = N / (N + d + 1 + σ²)`` and ``L(η*) = d (d + 1 + σ²)/(N + d + 1 + σ²) + σ²``.
        """
        d, N, s2 = self.d_x, self.n_context, self._options["noise"] ** 2
        denom = N + d + 1 + s2
        return N / denom, d * (d + 1 + s2) / denom + s2
