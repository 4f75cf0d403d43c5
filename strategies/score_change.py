"""The size of a direction's score change, ``‖X P Xᵀ‖_F`` over a batch, without forming ``X P Xᵀ``.

``‖X_b P X_bᵀ‖²_F = tr(Pᵀ A_b P A_b)`` with the sample's Gram matrix ``A_b = X_bᵀ X_b``. Per sample and
direction that costs ``4 d_e³`` against ``2 d_s d_e (d_s + d_e)`` for the ``(d_s, d_s)`` score change itself,
and the Gram matrices (``2 d_s d_e²`` per sample) serve every direction of a growth (``+holdout``'s searched
one and its refit). The sum of the traces is as accurate in float32 as the norm of the formed score change
(tests/test_score_change.py measures both against float64).

Where ``d_e`` is wide or the batch long, even the traces cost as much as a statistics update, and
:class:`SketchedNorms` estimates the norm instead from ``k`` Gaussian probes per sample (Hutchinson's
estimator: ``‖B‖²_F = E‖B ω‖²`` for ``ω ~ N(0, I)``), ``2 k (d_e² + 2 d_s d_e)`` per sample and direction, or
``4 k d_e²`` where the samples' Gram matrices are at hand (``‖X_b z‖² = zᵀ A_b z``). The norm only sets the unit
of λ (one RMS logit per entry, docs/mathematics.md §5.1), and so the line search's first trial; the probes are
seeded, so a growth is reproducible, and the estimate's relative standard error (1 % or less on the targets'
batches) is returned with it.

Only for unmasked batches: a mask takes entries out of ``X P Xᵀ`` that no Gram matrix (and no probe through
``X_bᵀ``) can leave out.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ._checks import pow2_scale

#: Gaussian probes per sample of a sketched norm (:class:`SketchedNorms`), and the fewest over the batch: the
#: relative standard error of ``‖X P Xᵀ‖`` is at most ``sqrt(1 / (2 n))`` for ``n`` probes in all (every sample's
#: score change of rank one), some 4 % at 256, and falls with the score changes' rank: 0.5–1 % measured on the
#: targets' batches, 3 % on a strongly anisotropic test batch of 32 samples.
SKETCH_PROBES = 8
SKETCH_MIN_PROBES = 256
#: The sketch replaces the exact norm only where it costs at most this share of the cheaper exact way: where the
#: two cost about the same, the exact norm is worth its price.
SKETCH_SHARE = 0.5
#: Seed of the probes: the same batch gives the same estimate in every growth.
SKETCH_SEED = 0
#: Multiply-adds of the cheaper exact norm over the batch (per direction) under which it is kept whatever the
#: sketch's share: about 1.5 ms on one CPU core (2^26). Below it an estimate would trade the exact unit of λ for
#: fractions of a millisecond (the quick sweep's batches need a few million).
SKETCH_MIN_WORK = 2**26


def grams_pay(X: Tensor, mask: Tensor | None) -> bool:
    """Whether :class:`SampleGrams` is the cheaper way to ``‖X P Xᵀ‖`` for the batch ``X`` ``(b, d_s, d_e)``.

    With two directions (a refit) the Gram matrices and traces cost ``2 d_s d_e² + 8 d_e³`` per sample against
    ``4 d_s d_e (d_s + d_e)`` for two score changes; with one, ``2 d_s d_e² + 4 d_e³`` against
    ``2 d_s d_e (d_s + d_e)``. Both favour the traces once ``2 d_e² ≤ d_s²``.
    """
    d_s, d_e = X.shape[-2:]
    return mask is None and 2 * d_e * d_e <= d_s * d_s


def sketch_probes(b: int) -> int:
    """Probes per sample of :class:`SketchedNorms` for a batch of ``b`` samples."""
    return max(SKETCH_PROBES, math.ceil(SKETCH_MIN_PROBES / max(b, 1)))


def sketch_pays(X: Tensor, mask: Tensor | None) -> bool:
    """Whether :class:`SketchedNorms` costs at most :data:`SKETCH_SHARE` of the cheaper exact way to ``‖X P Xᵀ‖``
    for the unmasked batch ``X`` ``(b, d_s, d_e)``, where that way is work enough to matter
    (:data:`SKETCH_MIN_WORK`).

    Per sample and direction: ``2 k (d_e² + 2 d_s d_e)`` with the probes' own product against
    ``min(2 d_s d_e (d_s + d_e), 4 d_e³)`` (the formed score change, or the traces with Gram matrices the statistics
    may have kept at no cost).
    """
    if mask is not None:
        return False
    b, d_s, d_e = X.shape
    exact = min(2 * d_s * d_e * (d_s + d_e), 4 * d_e**3)
    return (b * exact >= 2 * SKETCH_MIN_WORK
            and 2 * sketch_probes(b) * (d_e * d_e + 2 * d_s * d_e) <= SKETCH_SHARE * exact)


class SketchedNorms:
    """``‖X P Xᵀ‖_F`` over an unmasked batch estimated from seeded Gaussian probes, without forming ``X P Xᵀ``.

    ``‖X_b P X_bᵀ‖²_F = E_ω ‖X_b P X_bᵀ ω‖²`` for ``ω ~ N(0, I_{d_s})``: with ``k`` probes ``ω_bj`` per sample, the
    probes' images ``y_bj = X_bᵀ ω_bj`` are made once per batch and serve every direction of a growth, each of which
    then costs one product with ``P`` and one with ``X_b`` per probe.

    Parameters
    ----------
    X : Tensor
        The batch ``(b, d_s, d_e)``, floating.
    probes : int, optional
        ``k``, per sample (default :func:`sketch_probes`), at least 2 (the standard error needs two).
    seed : int
        Seed of the probes (a generator of the batch's own device; the global random stream is left alone).
    grams : Tensor, optional
        The samples' ``X_bᵀ X_b``, ``(b, d_e, d_e)``, where the caller has them (the statistics of the one batch,
        :attr:`strategies.statistics.Statistics.sample_grams`); left unchanged. Each probe's square is then
        ``zᵀ A_b z`` with ``z = P X_bᵀ ω``, a ``(d_e, d_e)`` product instead of one with ``X_b``: the same
        estimate up to rounding, at a quarter of the time at the targets' reference batch (CPU, one thread).
    """

    def __init__(self, X: Tensor, probes: int | None = None, seed: int = SKETCH_SEED, *,
                 grams: Tensor | None = None) -> None:
        b, d_s, d_e = X.shape
        k = sketch_probes(b) if probes is None else probes
        if k < 2:
            raise ValueError(f"a sketched norm needs at least 2 probes per sample, got {k}")
        if grams is not None and grams.shape != (b, d_e, d_e):
            raise ValueError(f"grams must be the samples' X_bᵀ X_b, shape {(b, d_e, d_e)}, got {tuple(grams.shape)}")
        generator = torch.Generator(device=X.device).manual_seed(seed)
        omega = torch.randn(b, k, d_s, generator=generator, dtype=X.dtype, device=X.device)
        Y = omega @ X  # (b, k, d_e): the rows y_bjᵀ = ω_bjᵀ X_b
        # Y near 1 (a power of two, exact), and each direction's rows too: the squares stay in range for an extreme X.
        self.scale = pow2_scale(Y)
        self.flat = Y.div_(self.scale).reshape(b * k, d_e)
        self.X = X
        self.k = k
        self.grams = None if grams is None else SampleGrams(grams=grams)

    def score_change_norm(self, P: Tensor, with_error: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """The estimate of ``‖X P Xᵀ‖_F`` over the batch, 0-dim, and with ``with_error`` its relative standard
        error (0-dim), on the device (no host transfer).

        Parameters
        ----------
        P : Tensor
            ``(d_e, d_e)``, in the batch's dtype and on its device.
        with_error : bool
            Also return the estimate's relative standard error, from the spread of each sample's probes.
        """
        b, k = self.X.shape[0], self.k
        Z = (self.flat @ P.mT).view(b, k, -1)  # (b, k, d_e): (P X_bᵀ ω_bj)ᵀ
        if self.grams is None:
            rows = Z @ self.X.mT  # (b, k, d_s): (X_b P X_bᵀ ω_bj)ᵀ
            s = pow2_scale(rows)
            squares = (rows / s).square().sum(dim=-1)  # (b, k): ‖X_b P X_bᵀ ω_bj‖², in units of (scale · s)²
            unit = self.scale * s
        else:
            s = pow2_scale(Z)
            Z = Z / s
            # ‖X_b z‖² = zᵀ A_b z; in units of (scale · s)² times the Gram matrices' own power of two.
            squares = ((Z @ self.grams.matrices) * Z).sum(dim=-1)
            unit = self.scale * s * self.grams.scale.sqrt()
        total = squares.mean(dim=-1).sum()
        norm = unit * total.clamp_min(0).sqrt()
        if not with_error:
            return norm
        # Var of the sum of the per-sample means; the norm's relative error is half its square's.
        spread = (squares.var(dim=-1) / k).sum().sqrt()
        return norm, 0.5 * spread / total


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
        #: ``A_b`` divided by :attr:`scale`, ``(b, d_e, d_e)``.
        self.matrices = A
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
