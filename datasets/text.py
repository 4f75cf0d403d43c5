"""Next-character prediction on English text that ships with Python.

The corpus is ``pydoc_data.topics.topics`` (the ``help()`` texts, ~465k characters),
joined with newlines in sorted key order. It changes between Python versions, so its
hash is part of :meth:`TextDataset.options` (and hence of cache keys).
"""

from __future__ import annotations

import functools
import hashlib
import math
from typing import Any

import torch
from torch import Tensor, nn

from .base import Dataset, GrowthModel, PositionalEmbed, init_linear

UNK = "\x00"  # stands for every character outside printable ASCII + newline; id 0
TRAIN_FRACTION = 0.9


@functools.cache
def corpus() -> str:
    """The raw corpus: every ``pydoc_data`` topic text, joined by newlines in sorted key order."""
    from pydoc_data.topics import topics

    return "\n".join(topics[k] for k in sorted(topics))


def _allowed(ch: str) -> bool:
    return ch == "\n" or 32 <= ord(ch) < 127


@functools.cache
def _encoded() -> tuple[tuple[str, ...], Tensor, str]:
    """Vocabulary (id -> char, UNK first), the encoded stream (n,) int64, and the corpus sha256."""
    text = corpus()
    # Curly quotes, dashes and a few letters are rare; one UNK id keeps the vocabulary small.
    vocab = (UNK, *sorted({c for c in text if _allowed(c)}))
    lookup = {c: i for i, c in enumerate(vocab)}
    ids = torch.tensor([lookup.get(c, 0) for c in text], dtype=torch.int64)
    return vocab, ids, hashlib.sha256(text.encode()).hexdigest()


class Embedding(nn.Module):
    """Token embedding ``(b, L) int64 -> (b, L, d_e)`` with weights drawn from a generator."""

    def __init__(self, vocab_size: int, d_e: int, gen: torch.Generator, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        super().__init__()
        # N(0, 1) like nn.Embedding: the token signal is comparable to the unit-amplitude PE.
        self.weight = nn.Parameter(torch.randn(vocab_size, d_e, generator=gen, dtype=dtype).to(device))

    def forward(self, ids: Tensor) -> Tensor:
        """Rows of the embedding table, (b, L, d_e)."""
        # F.embedding, not weight[ids]: the latter's backward (index_put_ accumulate) is not
        # bitwise reproducible on CPU threads, and the cached warm-up must be.
        return nn.functional.embedding(ids, self.weight)


def _cross_entropy(logits: Tensor, target: Tensor) -> Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


class TextDataset(Dataset):
    """Causal next-character prediction on the ``pydoc_data`` help texts.

    A sample is a window of ``d_s`` characters starting at a uniformly random position;
    the target at every position is the next character. Inputs and targets ``(b, d_s)``
    int64 ids. Train windows (inputs and targets) lie in the first 90% of the character
    stream, test windows in the last 10%. Model: embedding + sinusoidal PE -> causal
    block -> linear to the vocabulary, cross-entropy averaged over all positions.
    """

    name = "text"
    kind = "natural"
    description = "next-character prediction (causal) on Python's pydoc_data help texts"
    defaults: dict[str, Any] = {}
    causal = True

    def __init__(self, d_e: int, d_s: int, seed: int = 0, **options: Any) -> None:
        super().__init__(d_e, d_s, seed, **options)
        self.vocab, self._ids, self._sha = _encoded()
        n = self._ids.shape[0]
        self.boundary = math.floor(TRAIN_FRACTION * n)
        longest = min(self.boundary, n - self.boundary) - 1
        if self.d_s > longest:
            raise ValueError(f"text: d_s must be <= {longest} (the test stream's length - 1), got {self.d_s}")

    @property
    def vocab_size(self) -> int:
        """Number of character ids, UNK included."""
        return len(self.vocab)

    def options(self) -> dict[str, Any]:
        """No user options; the corpus and its hash identify the data."""
        return {"corpus": "pydoc_data.topics", "corpus_sha256": self._sha[:16], "vocab_size": self.vocab_size}

    def split_range(self, split: str) -> tuple[int, int]:
        """Half-open character range ``[lo, hi)`` that windows of ``split`` (targets included) stay in."""
        self._check_batch_args(1, split, 0)
        return (0, self.boundary) if split == "train" else (self.boundary, self._ids.shape[0])

    def starts(self, b: int, split: str = "train", index: int = 0) -> Tensor:
        """Start offsets (into the whole stream) of the windows of ``batch(b, split, index)``, (b,) int64."""
        lo, hi = self.split_range(split)
        self._check_batch_args(b, split, index)
        # A window takes d_s + 1 characters: d_s inputs and the last target.
        return lo + torch.randint(0, hi - lo - self.d_s, (b,), generator=self._generator("data", split, index))

    def batch(self, b: int, split: str = "train", index: int = 0) -> tuple[Tensor, Tensor]:
        """Inputs and next-character targets, both (b, d_s) int64; see :meth:`Dataset.batch`."""
        pos = self.starts(b, split, index).unsqueeze(1) + torch.arange(self.d_s + 1)
        window = self._ids[pos]
        return window[:, :-1], window[:, 1:]

    def decode(self, ids: Tensor) -> str:
        """Characters of a 1-D id tensor (UNK shown as U+FFFD)."""
        return "".join("\ufffd" if i == 0 else self.vocab[i] for i in ids.tolist())

    def build_model(self, d_k: int, *, n_heads: int = 1, bias: bool = False, scale_policy: str = "rescale",
                    dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> GrowthModel:
        """Embedding + PE -> causal block -> linear to the vocabulary, cross-entropy over all positions."""
        gen = self._generator("model")
        block = self._block(d_k, gen, n_heads=n_heads, bias=bias, scale_policy=scale_policy,
                            dtype=dtype, device=device)
        embed = PositionalEmbed(Embedding(self.vocab_size, self.d_e, gen, dtype, device), self.d_s, self.d_e,
                                dtype, device)
        head = init_linear(self.d_e, self.vocab_size, gen, dtype=dtype, device=device)
        return GrowthModel(embed, block, head, _cross_entropy)
