"""Optimiser state across a growth: which Adam moments survive, and in which basis.

A growth replaces a head's ``W_Q`` and ``W_K`` ``(d_in, d_k)`` by new parameters
``(d_in, d_k + p)``. Adam keeps, per parameter, ``exp_avg`` (first moment), ``exp_avg_sq``
(second moment) and ``step``. Two policies:

``pad`` (default)
    The old columns keep their moments, the ``p`` new columns start at zero, ``step`` is
    kept. Where the growth rescaled the old columns by ``α = sqrt(c / c')`` (the
    ``rescale`` policy), the gradient with respect to them scales by ``1/α``: the first
    moment is divided by ``α``, the second by ``α²``. A functional-gradient growth
    re-factorises ``Z'`` by an SVD, whose columns are not the old ones: its factors are
    first rotated by the orthogonal ``R`` that brings their first ``d_k`` columns closest
    to the old ones (:func:`align_to_old`, an orthogonal Procrustes problem; ``Z'`` is
    unchanged since ``W_Q R (W_K R)ᵀ = W_Q W_Kᵀ``), so "old column" keeps its meaning.
    With ``step`` kept and zero moments, Adam's first updates of a new entry are about
    ``lr · (1 - β₁) / sqrt(1 - β₂) ≈ 3.2 lr`` in size (bias correction is already ≈ 1).

``reset``
    The grown head's ``W_Q`` and ``W_K`` lose their state: Adam restarts them (zero
    moments, ``step = 0``, so its bias correction gives a first update of size ``lr``).

Every other parameter's state is left untouched by either policy.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

OPT_STATE_POLICIES = ("pad", "reset")


def align_to_old(W_Q: Tensor, W_K: Tensor, W_Q_old: Tensor, W_K_old: Tensor,
                 alpha: float = 1.0) -> tuple[Tensor, Tensor]:
    """Rotate new factors so their first columns best match the (rescaled) old ones.

    Parameters
    ----------
    W_Q, W_K : Tensor
        New factors, ``(d_in, r)``.
    W_Q_old, W_K_old : Tensor
        Old factors, ``(d_in, d_k)`` with ``d_k ≤ r``.
    alpha : float
        Rescaling of the old columns by the growth (``sqrt(c / c')``).

    Returns
    -------
    tuple of Tensor
        ``(W_Q R, W_K R)`` with ``R`` orthogonal ``(r, r)`` minimising
        ``‖W_Q R − [αW_Q_old, 0]‖² + ‖W_K R − [αW_K_old, 0]‖²``; the product
        ``W_Q W_Kᵀ`` is unchanged.
    """
    r, d_k = W_Q.shape[1], W_Q_old.shape[1]
    if W_K.shape != W_Q.shape or W_Q_old.shape != W_K_old.shape or d_k > r:
        raise ValueError(f"cannot align factors {tuple(W_Q.shape)}/{tuple(W_K.shape)} to old "
                         f"{tuple(W_Q_old.shape)}/{tuple(W_K_old.shape)}")
    target = torch.zeros_like(W_Q), torch.zeros_like(W_K)
    target[0][:, :d_k] = alpha * W_Q_old
    target[1][:, :d_k] = alpha * W_K_old
    C = W_Q.mT @ target[0] + W_K.mT @ target[1]  # (r, r)
    U, _, Vh = torch.linalg.svd(C.double())
    R = (U @ Vh).to(W_Q.dtype)
    return W_Q @ R, W_K @ R


def replace_parameter(opt: torch.optim.Optimizer, old: nn.Parameter, new: nn.Parameter, policy: str = "pad",
                      alpha: float = 1.0) -> None:
    """Make ``opt`` optimise ``new`` instead of ``old`` (a grown ``(d_in, d_k)`` -> ``(d_in, d_k + p)``).

    Parameters
    ----------
    opt : torch.optim.Optimizer
        Holds ``old`` in one of its parameter groups.
    old, new : nn.Parameter
        ``new`` has ``old``'s rows and at least its columns.
    policy : {"pad", "reset"}
        See the module docstring.
    alpha : float
        Rescaling of the old columns (moments of the old columns are divided by ``α`` and ``α²``).
    """
    if policy not in OPT_STATE_POLICIES:
        raise ValueError(f"unknown optimiser-state policy {policy!r}; valid: {', '.join(OPT_STATE_POLICIES)}")
    found = False
    for group in opt.param_groups:
        for i, p in enumerate(group["params"]):
            if p is old:
                group["params"][i] = new
                found = True
    if not found:
        raise ValueError("the optimiser does not hold the parameter being grown")
    state = opt.state.pop(old, None)
    if not state or policy == "reset":
        return
    d_k = old.shape[1]
    moved = {}
    for name, value in state.items():
        if torch.is_tensor(value) and value.shape == old.shape:
            grown = torch.zeros_like(new, memory_format=torch.preserve_format).detach()
            # exp_avg_sq and max_exp_avg_sq are second moments: they scale with the square.
            power = 2 if name.endswith("_sq") else 1
            grown[:, :d_k] = value / alpha**power
            moved[name] = grown
        else:
            moved[name] = value  # step and other scalars
    opt.state[new] = moved
