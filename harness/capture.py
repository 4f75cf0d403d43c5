"""What a growth sees: captured forward/backward passes of a model, and statistics over them.

A growth (one measurement, or one growth inside training) captures ``n`` train batches
with :func:`capture`, then accumulates a strategy's statistics over those batches with
:func:`statistics_over`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NamedTuple

import torch

from growbench import strategies


class BatchCapture(NamedTuple):
    """One captured batch, as every head of the block saw it.

    Attributes
    ----------
    X : Tensor, (b, d_s, d_in)
        The input as the projections see it (the block's ``Xa``).
    G : tuple of Tensor, each (b, d_s, d_s)
        ``∂L/∂S`` of each head, indexed by head.
    mask : Tensor or None
        The block's score mask, shared by every sample.
    """

    X: torch.Tensor
    G: tuple[torch.Tensor, ...]
    mask: torch.Tensor | None


class Capture(NamedTuple):
    """The captures of a growth's batches and the rest of the model on the last one.

    Attributes
    ----------
    batches : list of BatchCapture
        One per captured batch, in order.
    rest : Callable[[Tensor], Tensor]
        The part of the model after the block as a loss of its output, on the last batch's
        targets. ``block.loss_of_scores(rest, head)`` is the line search's loss on that batch;
        it is left to the caller to build because it snapshots the other heads' factors,
        which training changes between the growths of two heads.
    loss : float
        The model's loss on the last batch, from the forward whose backward gave its ``G``: what
        ``block.loss_of_scores(rest, head)`` gives at any head's current scores, up to rounding, until a growth
        changes the model (a growth's ``loss_before``).
    """

    batches: list[BatchCapture]
    rest: Callable[[torch.Tensor], torch.Tensor]
    loss: float


def capture(model, ds, b: int, indices: Iterable[int], device: str) -> Capture:
    """Forward/backward the train batches ``indices`` of ``ds`` through ``model`` with capture.

    Parameters
    ----------
    model : datasets.GrowthModel
        Its ``block`` is captured; its gradients are cleared afterwards (only the captures
        are kept).
    ds : datasets.Dataset
        Source of the batches, ``ds.batch(b, "train", index)``.
    b : int
        Batch size.
    indices : iterable of int
        Train batch indices, at least one.
    device : str

    Returns
    -------
    Capture
        As :func:`capture_heads`.
    """
    return capture_heads(model, [ds.batch(b, "train", index) for index in indices], device)


def capture_heads(model, batches: list[tuple[torch.Tensor, torch.Tensor]], device: str) -> Capture:
    """Forward/backward ``batches`` through ``model`` with capture, keeping each head's own input.

    Batches are drawn beforehand, so that a caller can keep making them (e.g. the original
    model's forward for distillation targets) out of a growth's FLOPs and wall time. Where
    the heads sit in different layers (``block.inputs_per_head``), ``BatchCapture.X`` is a
    tuple of each head's input ``(b, d_s, d_in)``; :func:`head_captures` gives one head's view.

    Returns
    -------
    Capture
        Per batch ``(X, G per head, mask)``, the rest of the model on the last batch and its loss there.
    """
    block = model.block
    out, targets, loss = [], None, None
    for inputs, targets in batches:
        inputs, targets = inputs.to(device), targets.to(device)
        model.zero_grad(set_to_none=True)
        with block.capture():
            loss = model.loss(inputs, targets)
            loss.backward()
        seen = [block.captured(h) for h in range(block.n_heads)]
        X = tuple(c.Xa for c in seen) if getattr(block, "inputs_per_head", False) else seen[0].Xa
        out.append(BatchCapture(X, tuple(c.G for c in seen), seen[0].mask))
    model.zero_grad(set_to_none=True)
    if targets is None:
        raise ValueError("capture needs at least one batch")
    return Capture(out, model.rest(targets), float(loss.detach()))


def head_captures(caps: list[BatchCapture], head: int) -> list[BatchCapture]:
    """``caps`` as ``head`` saw them: its own input where each head has one (see :func:`capture_heads`)."""
    return [c._replace(X=c.X[head]) if isinstance(c.X, tuple) else c for c in caps]


def statistics_over(strategy: strategies.Strategy | None, batches: Iterable[BatchCapture],
                    head: int = 0) -> strategies.Statistics:
    """``strategy``'s statistics of ``head`` accumulated over every captured batch.

    Parameters
    ----------
    strategy : strategies.Strategy or None
        Whose ``new_statistics()`` to fill; ``None`` for the plain statistics, the two Gram
        sums ``Σ XᵀX`` and ``Σ XᵀGX`` alone (``Statistics(split_half=False)``): the least any
        growth pays.
    batches : iterable of BatchCapture
    head : int

    Returns
    -------
    strategies.Statistics
    """
    stats = strategies.Statistics(split_half=False) if strategy is None else strategy.new_statistics()
    for X, G, mask in batches:
        stats.update(X, G[head], mask)
    return stats
