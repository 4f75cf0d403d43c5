"""scikit-learn's bundled 8×8 handwritten digits as a sequence of patch tokens.

``sklearn.datasets.load_digits`` ships with scikit-learn (no download): 1797 images,
16 grey levels, 10 classes. An image is cut into ``d_s = (8/ps)²`` square patches of
``ps × ps`` pixels (row-major), each a token of ``ps²`` pixel values in [0, 1].
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor, nn

from .base import Dataset, GrowthModel, PositionalEmbed, init_linear, torch_generator

PATCH_SIZES = {4: 4, 16: 2, 64: 1}  # d_s -> patch size
N_CLASSES = 10
TEST_FRACTION = 0.2


@functools.cache
def _digits() -> tuple[Tensor, Tensor]:
    """All images (n, 8, 8) float32 in [0, 1] and labels (n,) int64; loaded once per process."""
    from sklearn.datasets import load_digits  # lazy: importing sklearn costs about a second

    d = load_digits()
    images = torch.tensor(d.images, dtype=torch.float32) / 16.0
    return images, torch.tensor(d.target, dtype=torch.int64)


@functools.cache
def _split_ids() -> dict[str, Tensor]:
    """Image ids of each split: a fixed permutation, the same for every seed.

    Fixed (not seeded by ``seed``) so that held-out numbers of different seeds are on
    the same test images; the seed still changes the model and the batch order.
    """
    n = _digits()[0].shape[0]
    perm = torch.randperm(n, generator=torch_generator("digits", "split"))
    n_test = round(TEST_FRACTION * n)
    return {"train": perm[n_test:].sort().values, "test": perm[:n_test].sort().values}


def patchify(images: Tensor, ps: int) -> Tensor:
    """Cut images into row-major ``ps × ps`` patches.

    Parameters
    ----------
    images : Tensor, (n, 8, 8)
    ps : int
        Patch size dividing 8.

    Returns
    -------
    Tensor, (n, (8/ps)², ps²)
    """
    n, H, W = images.shape
    g_h, g_w = H // ps, W // ps
    return images.reshape(n, g_h, ps, g_w, ps).permute(0, 1, 3, 2, 4).reshape(n, g_h * g_w, ps * ps)


class MeanPoolClassifier(nn.Module):
    """Head: mean over tokens, then a linear map, ``(b, d_s, d_e) -> (b, n_classes)`` logits."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.linear = linear

    def forward(self, Y: Tensor) -> Tensor:
        """Logits (b, n_classes)."""
        return self.linear(Y.mean(dim=1))


def _cross_entropy(logits: Tensor, target: Tensor) -> Tensor:
    return nn.functional.cross_entropy(logits, target)


class DigitsDataset(Dataset):
    """8×8 digits as ``d_s`` patch tokens, classified after mean pooling.

    ``d_s ∈ {4, 16, 64}`` for patch sizes 4, 2, 1. Inputs ``(b, d_s, ps²)`` float32 pixels
    in [0, 1]; targets ``(b,)`` int64 labels. Fixed 80/20 train/test split of the 1797
    images (:func:`_split_ids`). Batch ``index`` of a split takes positions
    ``[index·b, (index+1)·b)`` of an endless stream of epochs, each epoch a permutation of
    the split seeded by ``(seed, split, epoch)``: consecutive batches see every image once
    per epoch. Model: linear patch projection to ``d_e`` + sinusoidal positional encoding
    -> block -> mean pool -> linear to 10 classes, cross-entropy.
    """

    name = "digits"
    kind = "natural"
    description = "sklearn 8x8 digits as patch tokens, mean-pool classifier"
    defaults: dict[str, Any] = {}

    def __init__(self, d_e: int, d_s: int, seed: int = 0, **options: Any) -> None:
        super().__init__(d_e, d_s, seed, **options)
        if self.d_s not in PATCH_SIZES:
            valid = ", ".join(f"{s} (patch {p}×{p})" for s, p in PATCH_SIZES.items())
            raise ValueError(f"digits: d_s must be one of {valid}; got {self.d_s}")
        self.patch_size = PATCH_SIZES[self.d_s]
        self.patch_dim = self.patch_size**2

    def split_ids(self, split: str) -> Tensor:
        """Ids (into ``load_digits()``) of the images of ``split``, (n_split,) int64, sorted."""
        self._check_batch_args(1, split, 0)
        return _split_ids()[split]

    def image_ids(self, b: int, split: str = "train", index: int = 0) -> Tensor:
        """Ids of the images in ``batch(b, split, index)``, (b,) int64."""
        self._check_batch_args(b, split, index)
        ids = _split_ids()[split]
        n = ids.shape[0]
        pos = torch.arange(index * b, (index + 1) * b)
        epoch, offset = pos // n, pos % n
        out = torch.empty(b, dtype=torch.int64)
        for e in epoch.unique().tolist():
            perm = torch.randperm(n, generator=self._generator("order", split, e))
            sel = epoch == e
            out[sel] = ids[perm[offset[sel]]]
        return out

    def batch(self, b: int, split: str = "train", index: int = 0) -> tuple[Tensor, Tensor]:
        """Patches (b, d_s, ps²) float32 and labels (b,) int64; see :meth:`Dataset.batch`."""
        ids = self.image_ids(b, split, index)
        images, labels = _digits()
        return patchify(images[ids], self.patch_size), labels[ids]

    def build_model(self, d_k: int, *, n_heads: int = 1, bias: bool = False, scale_policy: str = "rescale",
                    dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> GrowthModel:
        """Patch projection + PE -> block -> mean-pool linear classifier, cross-entropy."""
        gen = self._generator("model")
        block = self._block(d_k, gen, n_heads=n_heads, bias=bias, scale_policy=scale_policy,
                            dtype=dtype, device=device)
        embed = PositionalEmbed(init_linear(self.patch_dim, self.d_e, gen, dtype=dtype, device=device),
                                self.d_s, self.d_e, dtype, device)
        head = MeanPoolClassifier(init_linear(self.d_e, N_CLASSES, gen, dtype=dtype, device=device))
        return GrowthModel(embed, block, head, _cross_entropy)
