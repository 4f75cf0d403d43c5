"""Input validation shared by every strategy component.

Every public entry point calls these before touching the data, so that bad input
fails with a message naming the problem instead of producing NaN weights.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

#: The dtypes a strategy takes: half precision is computed in float32 (:func:`compute_dtype`); others
#: (float8, complex, integers) have no factorisation kernels or no meaning for a real gradient.
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_finite(name: str, t: Tensor) -> None:
    """Raise ``ValueError`` if ``t`` is not a real floating-point tensor with data, or holds NaN or Inf."""
    check_float_tensor(name, t)
    # One reduction instead of an element-wise mask: any NaN/Inf makes the sum non-finite.
    # Only then are entries counted, so a finite tensor whose sum overflows still passes.
    if not bool(torch.isfinite(t.sum())):
        refuse_non_finite(name, t)


def check_float_tensor(name: str, t: Tensor) -> None:
    """Raise ``ValueError`` if ``t`` is not a real floating-point tensor with data (its values unread)."""
    if not torch.is_tensor(t):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name} must be a float16, bfloat16, float32 or float64 tensor, got dtype {t.dtype}")
    check_device(name, t)


def finite_magnitudes(named: dict[str, Tensor]) -> list[float]:
    """``max|t|`` of each tensor, in one host transfer, after refusing any that holds NaN or Inf.

    :func:`check_finite` and :func:`abs_max` in one pass over each tensor: ``max|t|`` is finite exactly when
    every entry is (it propagates NaN).

    Parameters
    ----------
    named : dict of str to Tensor
        Non-empty floating tensors (already checked by :func:`check_float_tensor`), by the name an error gives.
    """
    magnitudes = torch.stack([abs_max(t.detach()) for t in named.values()]).tolist()
    for (name, t), m in zip(named.items(), magnitudes, strict=True):
        if not math.isfinite(m):
            refuse_non_finite(name, t)
    return magnitudes


def refuse_non_finite(name: str, t: Tensor) -> None:
    """Raise the ``ValueError`` that counts ``t``'s NaN/Inf entries (none where a sum merely overflowed)."""
    n_bad = int((~torch.isfinite(t)).sum())
    if n_bad:
        raise ValueError(f"{name} contains {n_bad} NaN/Inf entries")


def check_device(name: str, t: Tensor) -> None:
    """Refuse a tensor without data (the ``meta`` device) or a sparse one: no value of it can be read."""
    if t.device.type == "meta":
        raise ValueError(f"{name} is on the meta device (a shape without data): move it to a real device first")
    if t.layout != torch.strided:
        raise ValueError(f"{name} must be a dense tensor, got layout {t.layout}")


def check_batch(X: Tensor, G: Tensor, mask: Tensor | None = None, values: bool = True) -> Tensor | None:
    """Validate a batch ``X (b, d_s, d_e)``, ``G (b, d_s, d_s)`` and an optional mask.

    ``values=False`` leaves the NaN/Inf check of ``X`` and ``G`` to the caller (a growth makes it with their
    magnitudes, :func:`finite_magnitudes`).

    Returns
    -------
    mask : Tensor or None
        The mask as a bool tensor broadcastable to ``(b, d_s, d_s)``.
    """
    check = check_finite if values else check_float_tensor
    check("X", X)
    check("G", G)
    if X.dim() != 3:
        raise ValueError(f"X must have shape (b, d_s, d_e), got {tuple(X.shape)}")
    b, d_s, _ = X.shape
    if G.shape != (b, d_s, d_s):
        raise ValueError(
            f"G must have shape (b, d_s, d_s) = {(b, d_s, d_s)} to match X {tuple(X.shape)}, "
            f"got {tuple(G.shape)}"
        )
    if G.dtype != X.dtype or G.device != X.device:
        raise ValueError(f"X and G must share dtype and device, got {X.dtype}/{X.device} and {G.dtype}/{G.device}")
    if b == 0 or d_s == 0 or X.shape[2] == 0:
        raise ValueError(f"X must not be empty, got shape {tuple(X.shape)}")
    return check_mask(mask, b, d_s, X.device)


def check_mask(mask: Tensor | None, b: int, d_s: int, device: torch.device) -> Tensor | None:
    """Validate a mask of shape ``(d_s, d_s)`` or ``(b, d_s, d_s)`` on ``device``; True = attended."""
    if mask is None:
        return None
    if not torch.is_tensor(mask):
        raise ValueError(f"mask must be a bool tensor, got {type(mask).__name__}")
    check_device("mask", mask)
    if mask.device != torch.device(device):
        raise ValueError(f"mask is on {mask.device} but X is on {device}: put the mask on X's device")
    if mask.shape not in ((d_s, d_s), (b, d_s, d_s)):
        raise ValueError(
            f"mask must have shape (d_s, d_s) or (b, d_s, d_s) with d_s={d_s}, b={b}, got {tuple(mask.shape)}"
        )
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must have dtype torch.bool (True = attended), got {mask.dtype}")
    return mask


def check_factors(W_Q: Tensor, W_K: Tensor, d_e: int, p: int) -> int:
    """Validate ``W_Q, W_K (d_e, d_k)`` against ``X`` and the growth ``p``; return ``d_k``."""
    check_finite("W_Q", W_Q)
    check_finite("W_K", W_K)
    if W_Q.dim() != 2 or W_K.dim() != 2 or W_Q.shape != W_K.shape:
        raise ValueError(
            f"W_Q and W_K must both have shape (d_e, d_k), got {tuple(W_Q.shape)} and {tuple(W_K.shape)}"
        )
    if W_Q.shape[0] != d_e:
        raise ValueError(
            f"W_Q has {W_Q.shape[0]} rows but X has d_e={d_e} columns (with bias, X must include the ones column)"
        )
    if isinstance(p, bool) or not isinstance(p, int) or p < 0:
        raise ValueError(f"p must be a non-negative int, got {p!r}")
    d_k = W_Q.shape[1]
    if d_k + p > d_e:
        raise ValueError(f"d_k + p > d_e: cannot grow d_k={d_k} by p={p} beyond d_e={d_e}")
    return d_k


def check_number(name: str, value: object, integer: bool = False, optional: bool = False) -> None:
    """Refuse an option that is not a real number (an ``int`` where ``integer``; None too where ``optional``).

    Components compare their options with bounds; a string or a list there would raise ``TypeError`` from the
    comparison, or later, inside a growth. This names the option instead.

    Raises
    ------
    ValueError
        ``"<name> must be a number, got 'x'"``, say.
    """
    if optional and value is None:
        return
    kinds = int if integer else int | float
    if isinstance(value, bool) or not isinstance(value, kinds):
        what = "an integer" if integer else "a number"
        raise ValueError(f"{name} must be {what}{' or None' if optional else ''}, got {value!r}")


def check_scale(name: str, c: float) -> float:
    """Validate an attention scale: a finite positive number."""
    try:
        c = float(c)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive finite number, got {c!r}") from None
    if not (c > 0 and c < float("inf")):
        raise ValueError(f"{name} must be a positive finite number, got {c!r}")
    return c


def check_loss_before(value: object) -> float | None:
    """A caller's loss at the current scores (``grow(loss_before=...)``) as a float, or None where not given.

    Raises
    ------
    ValueError
        A value that is not one real number (a Python number or a one-element real tensor), or not finite.
    """
    if value is None:
        return None
    if torch.is_tensor(value):
        if value.numel() != 1 or value.is_complex() or not value.is_floating_point() or value.device.type == "meta":
            raise ValueError(f"loss_before must be the loss at the current scores, one real number, got a "
                             f"{value.dtype} tensor of shape {tuple(value.shape)} on {value.device}")
        value = value.detach()  # a training loss still in its graph: read its value, without autograd's warning
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"loss_before must be the loss at the current scores, a number, got {value!r:.80}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"loss_before is {value}: a growth needs the finite loss at the current scores (leave it "
                         "out to have the growth evaluate it)")
    return value


#: Inputs of these dtypes are computed in float32 (see :func:`compute_dtype`).
HALF_DTYPES = (torch.float16, torch.bfloat16)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a strategy computes in for inputs of ``dtype``.

    Parameters
    ----------
    dtype : torch.dtype
        The inputs' dtype.

    Returns
    -------
    torch.dtype
        float32 for float16 and bfloat16, ``dtype`` itself otherwise.

    Notes
    -----
    torch has no float16/bfloat16 kernels for the factorisations a strategy needs
    (Cholesky, eigh, SVD, pinv) on the CPU, and even where it has (CUDA), 3 or 4
    significant digits would let rounding decide the weak directions of ``E[XᵀX]``.
    Widening to float32 is exact, so the result is the float32 result of the same inputs.
    """
    return torch.float32 if dtype in HALF_DTYPES else dtype


def abs_max(t: Tensor) -> Tensor:
    """``max|t|`` as a 0-dim tensor on ``t``'s device, equal to ``t.abs().amax()`` (NaN included).

    One pass and no copy: ``t.abs()`` would allocate a tensor the size of ``t`` (a batch of scores
    or inputs, tens of MB at the scale set, where every fresh allocation is also page-faulted in).

    Parameters
    ----------
    t : Tensor
        Non-empty, of a floating dtype.
    """
    low, high = torch.aminmax(t)
    return torch.maximum(high, -low).abs()  # .abs() of a 0-dim tensor: +0 where t is all -0


def pow2_scale(t: Tensor) -> Tensor:
    """A power of two within a factor 2 of ``max|t|`` (1 when ``t`` is zero), 0-dim on ``t``'s device.

    Dividing by a power of two is exact (barring underflow), so a quantity linear in
    ``t`` can be computed on ``t / s`` and multiplied back by ``s`` bit for bit, while its
    squares (norms, inner products) stay far from float32's overflow and underflow.
    No host transfer: the scale stays on the device.

    Parameters
    ----------
    t : Tensor
        Finite, non-empty.

    Returns
    -------
    Tensor
        ``2^e`` with ``max|t| ∈ [2^(e-1), 2^e)``, of ``t``'s dtype.
    """
    m = abs_max(t)
    one = torch.ones_like(m)
    # The exponent in t's dtype: torch 2.3's ldexp raises 2 to an integer exponent in float32,
    # which underflows to 0 below 2^-149 (a float64 gradient of 1e-125 would scale to 0).
    return torch.where(m > 0, torch.ldexp(one, torch.frexp(m).exponent.to(m.dtype)), one)


#: ``max|X|`` a growth computes in each dtype. Its sums of squares (``E[XᵀX]`` and its Frobenius
#: norm, ``‖X P Xᵀ‖``) grow as ``|X|⁴`` times the tokens squared, its direction ``P`` as ``|X|⁻²``:
#: outside this range they overflow or underflow the dtype (float32 inputs are widened to float64).
X_RANGE = {torch.float32: (2.0**-16, 2.0**16), torch.float64: (2.0**-200, 2.0**200)}


def range_dtype(X: Tensor, x_max: float | None = None) -> torch.dtype:
    """The dtype a strategy computes in for the batch ``X``, given its magnitude.

    Parameters
    ----------
    X : Tensor
        A checked batch (:func:`check_batch`).
    x_max : float, optional
        ``max|X|`` when the caller has it already; otherwise it is read (one host transfer).

    Returns
    -------
    torch.dtype
        :func:`compute_dtype` of ``X``'s dtype, or float64 where ``max|X|`` is outside that
        dtype's :data:`X_RANGE` (widening is exact, so the result is that of the same inputs).
        An all-zero ``X`` keeps :func:`compute_dtype`: no step can change its scores.

    Raises
    ------
    ValueError
        ``max|X|`` outside even float64's range.
    """
    x_max = float(abs_max(X)) if x_max is None else x_max
    dtype = compute_dtype(X.dtype)
    for candidate in dict.fromkeys((dtype, torch.float64)):
        lo, hi = X_RANGE[candidate]
        if x_max == 0 or lo <= x_max <= hi:
            return candidate
    lo, hi = X_RANGE[torch.float64]
    raise ValueError(f"X: max |entry| {x_max:.3g} is outside [{lo:.3g}, {hi:.3g}], where a growth can square and "
                     "invert it even in float64: rescale the inputs")
