"""The size of a direction's score change, ``‖X P Xᵀ‖_F`` over a batch, without forming ``X P Xᵀ``.

``‖X_b P X_bᵀ‖²_F = tr(Pᵀ A_b P A_b)`` with the sample's Gram matrix ``A_b = X_bᵀ X_b``. Per sample and
direction that costs ``4 d_e³`` against ``2 d_s d_e (d_s + d_e)`` for the ``(d_s, d_s)`` score change itself,
and the Gram matrices (``2 d_s d_e²`` per sample) serve every direction of a growth (``+holdout``'s searched
one and its refit). The sum of the traces is as accurate in float32 as the norm of the formed score change
(tests/test_score_change.py measures both against float64).

Only for unmasked batches: a mask takes entries out of ``X P Xᵀ`` that no Gram matrix can leave out.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._checks import pow2_scale


def grams_pay(X: Tensor, mask: Tensor | None) -> bool:
    """Whether :class:`SampleGrams` is the cheaper way to ``‖X P Xᵀ‖`` for the batch ``X`` ``(b, d_s, d_e)``.

    With two directions (a refit) the Gram matrices and traces cost ``2 d_s d_e² + 8 d_e³`` per sample against
    ``4 d_s d_e (d_s + d_e)`` for two score changes; with one, ``2 d_s d_e² + 4 d_e³`` against
    ``2 d_s d_e (d_s + d_e)``. Both favour the traces once ``2 d_e² ≤ d_s²``.
    """
    d_s, d_e = X.shape[-2:]
    return mask is None and 2 * d_e * d_e <= d_s * d_s


class SampleGrams:
    """The Gram matrices ``A_b = X_bᵀ X_b`` of a batch's samples, divided by one power of two near their largest
    entry (exact), so that the traces neither overflow nor underflow.

    Parameters
    ----------
    X : Tensor, optional
        The batch ``(b, d_s, d_e)``.
    grams : Tensor, optional
        Its samples' ``X_bᵀ X_b``, ``(b, d_e, d_e)``, where the caller has them already (the statistics of the
        one batch, :attr:`strategies.statistics.Statistics.sample_grams`); left unchanged.
    """

    def __init__(self, X: Tensor | None = None, *, grams: Tensor | None = None) -> None:
        if (X is None) == (grams is None):
            raise ValueError("SampleGrams takes the batch X or its samples' Gram matrices (grams=), one of the two")
        A = X.mT @ X if grams is None else grams  # (b, d_e, d_e)
        self.scale = pow2_scale(A)
        self.d_e = A.shape[-1]
        # Flattened to (b·d_e, d_e): each direction's products are then one GEMM, not b small ones. Divided in
        # place only where the matrices are this object's own (the same numbers either way: an exact power of two).
        A = A.div_(self.scale) if grams is None else A / self.scale
        self.flat = A.reshape(-1, self.d_e)

    def score_change_norm(self, P: Tensor) -> Tensor:
        """``‖X P Xᵀ‖_F`` over the batch, 0-dim.

        Parameters
        ----------
        P : Tensor
            ``(d_e, d_e)``, in the Gram matrices' dtype and on their device.

        Returns
        -------
        Tensor
            ``sqrt(Σ_b ⟨A_b P, P A_b⟩)``, on the device (no host transfer).
        """
        d = self.d_e
        # A_b P and A_b Pᵀ in one product; A_b is symmetric, so P A_b is the second one transposed.
        F = (self.flat @ torch.cat([P, P.mT], 1)).view(-1, d, 2 * d)
        squares = torch.sum(F[..., :d] * F[..., d:].mT)  # summed pairwise by torch: float32 keeps ~7 digits
        return self.scale * squares.clamp_min(0).sqrt()
