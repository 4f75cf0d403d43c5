"""The loss a growth evaluates: the caller's ``loss_of_scores``, counted and checked, and the optional protocol
that lets a search which moves some samples recompute only their attention.

A ``loss_of_scores`` maps a head's scores ``(b, d_s, d_s)`` to the loss. Attention is sample by sample (a softmax
over each row, then a product with that sample's values), so a loss may offer two more methods
(:class:`AttentionSplit`): ``attend(S, samples)``, the output on the samples ``samples`` at their scores ``S``
(the head's, or the whole site's with the head's term in it), and ``from_attention(out)``, the loss given that
output on every sample. Then ``loss(S) =
from_attention(attend(S, slice(None)))``, and a ``+holdout`` search on one batch, whose trials move only the
held-out half, computes each trial's softmax and product over that half alone and keeps the other half's output
from the current scores (the most expensive part of a call at the reference sizes, about 85%).

A trial of the normal path has its scores as two factors, ``S = L Rᵀ`` with ``L, R`` ``(b, d_s, r)``. A loss that
also offers ``attend_factors(L, R, samples)`` (:class:`FactoredAttention`) forms them a few samples at a time, each
group's product, softmax and product with the values while its scores are in the CPU's cache: the same numbers as
``attend(L @ R.mT, samples)``, bit for bit, without the ``(b, d_s, d_s)`` scores in memory (at the reference sizes a
trial with its scores took 11 % less time on the held-out half, 15 % less on the whole batch, CPU, one thread).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from .timing import section


@runtime_checkable
class AttentionSplit(Protocol):
    """A ``loss_of_scores`` that also offers its attention and the rest of its computation apart."""

    def __call__(self, S: Tensor) -> Tensor:
        """The loss at the scores ``S`` ``(b, d_s, d_s)``: ``from_attention(attend(S, slice(None)))``."""

    def attend(self, S: Tensor, samples: slice) -> Tensor:
        """The output ``(n, d_s, d_out)`` (the head's, or the site's) on the ``n`` samples ``samples`` of the batch
        at their scores ``S`` ``(n, d_s, d_s)``, each sample's rows its own."""

    def from_attention(self, out: Tensor) -> Tensor:
        """The loss given that output on every sample, ``(b, d_s, d_out)``: a scalar."""


@runtime_checkable
class FactoredAttention(AttentionSplit, Protocol):
    """An :class:`AttentionSplit` loss that also takes scores as factors."""

    def attend_factors(self, L: Tensor, R: Tensor, samples: slice) -> Tensor:
        """``attend(L @ R.mT, samples)``, bit for bit, for the ``n`` samples ``samples`` at the scores ``L Rᵀ``,
        ``L, R`` ``(n, d_s, r)``, formed a few samples at a time."""


class CountedLoss:
    """Wraps ``loss_of_scores`` to count its calls and check what it returns.

    Parameters
    ----------
    fn : callable
        The caller's ``loss_of_scores``.
    dtype : torch.dtype, optional
        The dtype ``fn`` receives scores in (the inputs' own, for half-precision inputs
        computed in float32); the loss is then widened back to the scores' dtype. The casts
        are differentiable, so the Newton search's derivatives along λ still work.
    """

    def __init__(self, fn: Callable[[Tensor], Tensor], dtype: torch.dtype | None = None) -> None:
        if not callable(fn):
            raise ValueError(f"loss_of_scores must be callable (scores -> scalar loss), got {type(fn).__name__}")
        self.fn = fn
        self.dtype = dtype
        self.calls = 0
        #: ``(out, samples, buffer)`` of the last :meth:`with_samples` call made without autograd: ``out`` with
        #: the rows ``samples`` rewritten by each such call (a copy of the batch's output per search, not per call).
        self._scratch: tuple[Tensor, slice, Tensor] | None = None
        #: Whether ``fn`` offers :class:`AttentionSplit`'s two methods.
        self.splits = isinstance(fn, AttentionSplit)
        #: Whether ``fn`` also takes scores as factors (:class:`FactoredAttention`).
        self.factored = isinstance(fn, FactoredAttention)

    def _cast(self, S: Tensor) -> bool:
        return self.dtype is not None and S.dtype != self.dtype

    def _in(self, S: Tensor) -> Tensor:
        """The scores as ``fn`` receives them: in ``dtype`` where one is set."""
        return S.to(self.dtype) if self._cast(S) else S

    def _checked(self, value: object, S: Tensor) -> Tensor:
        """``fn``'s value checked, as a 0-dim tensor (widened back to the scores' dtype where they were cast)."""
        if not torch.is_tensor(value) or value.numel() != 1:
            raise ValueError(f"loss_of_scores must return a scalar tensor, got {value!r:.80}")
        if value.is_complex() or value.device.type == "meta":
            raise ValueError(
                f"loss_of_scores must return a real scalar with a value, got {value.dtype} on {value.device}")
        value = value.reshape(())
        return value.to(S.dtype) if self._cast(S) and value.is_floating_point() else value

    def __call__(self, S: Tensor) -> Tensor:
        self.calls += 1
        with section("loss calls"):
            value = self.fn(self._in(S))
        return self._checked(value, S)

    def attention(self, S: Tensor) -> tuple[Tensor, Tensor]:
        """``(the loss at S, the output on every sample)``: one call, through ``fn``'s split."""
        self.calls += 1
        with section("loss calls"):
            out = self.fn.attend(self._in(S), slice(None))
            value = self.fn.from_attention(out)
        return self._checked(value, S), out

    def with_samples(self, out: Tensor, samples: slice, S: Tensor) -> Tensor:
        """The loss where the samples ``samples`` have the scores ``S`` and every other sample the output ``out``
        ``(b, d_s, d_out)`` already computed: one call, whose softmax and product cover ``samples`` alone.

        Without autograd, successive calls with the same ``out`` and ``samples`` write into one copy of ``out``
        (``fn.from_attention`` must not keep its argument past the call; ``out`` itself is never changed).
        """
        self.calls += 1
        with section("loss calls"):
            part = self.fn.attend(self._in(S), samples)  # differentiable in S
            value = self._with_part(out, samples, part)
        return self._checked(value, S)

    def _with_part(self, out: Tensor, samples: slice, part: Tensor) -> Tensor:
        """``fn.from_attention`` of ``out`` with the rows ``samples`` replaced by ``part``."""
        if torch.is_grad_enabled():
            whole = out.clone()
        else:
            if self._scratch is None or self._scratch[0] is not out or self._scratch[1] != samples:
                self._scratch = (out, samples, out.clone())
            whole = self._scratch[2]
        whole[samples] = part
        return self.fn.from_attention(whole)

    def _takes_factors(self, L: Tensor) -> bool:
        """Whether a call at the scores ``L Rᵀ`` can go through ``fn.attend_factors``: ``fn`` offers it, no cast is
        due (a cast scores' product would round differently) and nothing is differentiated."""
        return self.factored and not self._cast(L) and not torch.is_grad_enabled()

    def at_factors(self, L: Tensor, R: Tensor) -> Tensor:
        """``self(L @ R.mT)``, ``L, R`` ``(b, d_s, r)``: through ``fn.attend_factors`` where it offers it."""
        if not self._takes_factors(L):
            return self(L @ R.mT)
        self.calls += 1
        with section("loss calls"):
            value = self.fn.from_attention(self.fn.attend_factors(L, R, slice(None)))
        return self._checked(value, L)

    def with_sample_factors(self, out: Tensor, samples: slice, L: Tensor, R: Tensor) -> Tensor:
        """``self.with_samples(out, samples, L @ R.mT)``, ``L, R`` ``(n, d_s, r)`` of the samples ``samples``:
        through ``fn.attend_factors`` where it offers it."""
        if not self._takes_factors(L):
            return self.with_samples(out, samples, L @ R.mT)
        self.calls += 1
        with section("loss calls"):
            value = self._with_part(out, samples, self.fn.attend_factors(L, R, samples))
        return self._checked(value, L)
