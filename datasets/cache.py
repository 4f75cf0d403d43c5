"""Warm-up training and its on-disk cache.

Growth is measured at a trained point: :func:`trained_model` trains every parameter of
a fresh model with Adam for ``warmup_steps`` train batches (``index = step``) and caches
the resulting ``state_dict``. A cache file is keyed by the sha256 of a JSON of every
setting that affects the weights and written atomically.

Loading checks a cache file for damage and accidents, not for forgery. With the weights it
stores a sha256 (:func:`checksum`, over the key, the loss and every tensor's bytes in sorted
key order) and the *check loss*: the trained model's loss on the train batch right after the
warm-up (``index = warmup_steps``, eval mode). On load, in this order:

1. the file must unpickle (weights only: no code runs) to a record with this key;
2. the checksum must match (a flipped bit anywhere in the tensor data, a truncated write);
3. every weight must be finite;
4. every weight must be within Adam's reach of its initial value,
   ``|w - w0| <= ADAM_REACH · lr · warmup_steps`` (+ rounding slack): Adam moves a
   coordinate by at most ``~7.3 lr`` per step with the default betas (see
   :data:`ADAM_REACH`), which catches weights of another run or another version written
   under this key;
5. the recomputed check loss must equal the stored one within rounding (weights that do not
   reproduce the loss they were saved with).

A file written on purpose to pass these checks would pass them: like pip's cache, the cache
folder is trusted, and whoever can write to it can already run code as its owner.

Anything wrong (unreadable, stale, incompatible, or failing a check) means: warn with a
:class:`CacheWarning` naming the file and the reason, retrain, and overwrite; never
fail. A warm-up whose weights or check loss are not finite is not cached.

The record's mechanics are shared with the reference projection's cache
(:mod:`harness.reference`): :func:`read_record` unpickles weights only (no code runs) and
checks the key and the checksum, and :func:`save_record` writes a temporary file in the
same folder, with the user's own permissions (``mkstemp``: readable and writable by the
owner only), and renames it over the target, never through a symlink. A write that fails
(a full disk: ``torch.save`` raises ``RuntimeError``, not ``OSError``) leaves no temporary
file and costs time, not correctness. The checksum proves that a file is whole, not who
wrote it: the cache directory is trusted, like pip's cache, and should be the user's own.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .base import Dataset, GrowthModel

# Bump when a change of the code (datasets, models, warm-up) changes trained weights,
# or the file format (2: checksum and check loss stored with the weights).
CACHE_VERSION = 2

# Adam (betas 0.9, 0.999, no weight decay) moves a coordinate by lr·|m̂|/(√v̂ + eps) per
# step; Cauchy-Schwarz bounds |m|/√v by (1-β1)/√(1-β2)/√(1-β1²/β2) ≈ 7.27, and bias
# correction never raises that, so after n steps |w - w0| <= 7.27·lr·n. 10 leaves margin.
ADAM_REACH = 10.0
# Slack of the reach bound for rounding of the initial weights and of the updates.
REACH_RTOL, REACH_ATOL = 1e-4, 1e-6
# Relative tolerance of the recomputed check loss (thread counts change reduction order);
# widened to 16 ulps of the model's dtype for half precision.
LOSS_RTOL = 1e-4


class CacheWarning(UserWarning):
    """A cache file failed a check and is rebuilt (retrained or recomputed, and overwritten), or was not written."""


class CacheDamaged(Exception):
    """A cache file that exists but must not be used; the message is the reason."""


def cache_key(ds: Dataset, d_k: int, *, warmup_steps: int, batch_size: int, lr: float, n_heads: int, bias: bool,
              scale_policy: str, dtype: torch.dtype, device: torch.device | str) -> str:
    """Canonical JSON of every setting that affects the warmed-up weights."""
    return json.dumps({
        "cache_version": CACHE_VERSION,
        "torch": torch.__version__,
        "dataset": ds.name,
        "options": ds.options(),
        "d_e": ds.d_e,
        "d_s": ds.d_s,
        "seed": ds.seed,
        # Plain Python types: numpy scalars would not serialise and 3 vs 3.0 would split keys.
        "d_k": int(d_k),
        "n_heads": int(n_heads),
        "bias": bool(bias),
        "scale_policy": str(scale_policy),
        "warmup_steps": int(warmup_steps),
        "batch_size": int(batch_size),
        "lr": float(lr),
        "dtype": str(dtype),
        # Kernels (and their rounding) differ between CPU and GPU, so their weights do too.
        "device_type": torch.device(device).type,
        # On CPU the thread count splits reductions differently: digits' warm-up moves by 5e-7 between one and
        # two threads, and a cache shared between them made a sweep's results depend on who filled it first.
        "cpu_threads": torch.get_num_threads() if torch.device(device).type == "cpu" else None,
    }, sort_keys=True, separators=(",", ":"))


def cache_path(cache_dir: str | Path, ds: Dataset, key_json: str) -> Path:
    """``<cache_dir>/<dataset>-<sha256(key_json)>.pt``."""
    return Path(cache_dir) / f"{ds.name}-{hashlib.sha256(key_json.encode()).hexdigest()}.pt"


def warm_up(model: GrowthModel, ds: Dataset, *, steps: int, batch_size: int, lr: float) -> None:
    """Train every parameter of ``model`` in place: Adam, ``steps`` train batches with ``index = step``.

    Deterministic on CPU: batches are pure functions of the index and nothing draws from
    the global RNG.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=lr)
    model.train()
    with torch.enable_grad():  # a caller inside no_grad() must still get a trained model
        for step in range(steps):
            inputs, targets = ds.batch(batch_size, "train", step)
            opt.zero_grad(set_to_none=True)
            model.loss(inputs, targets).backward()
            opt.step()
    opt.zero_grad(set_to_none=True)


def digest(key_json: str, note: str, tensors: dict[str, torch.Tensor]) -> str:
    """sha256 of a cache record: its key, a note of its other values, and every tensor in sorted name order.

    Parameters
    ----------
    key_json : str
        The record's key (canonical JSON).
    note : str
        The record's other values as exact text (a float as ``float.hex``).
    tensors : dict[str, Tensor]
        Each entry contributes its name, dtype, shape and raw bytes.

    Returns
    -------
    str
        Hex digest; independent of the tensors' device.
    """
    h = hashlib.sha256()
    h.update(key_json.encode())
    h.update(note.encode())
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        h.update(f"\0{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        # Raw bytes through a uint8 view: works for every dtype (numpy has no bfloat16).
        h.update(t.reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def checksum(key_json: str, loss: float, state: dict[str, torch.Tensor]) -> str:
    """sha256 of a warm-up record: the key, the check loss (exactly, as ``float.hex``) and the ``state_dict``."""
    return digest(key_json, float(loss).hex(), state)


def read_record(path: Path, key_json: str, device: torch.device | str, tensors: str,
                note: Callable[[dict], str]) -> dict:
    """The record a cache file holds, checked: unpickled weights only, this key, a matching checksum.

    Parameters
    ----------
    path : Path
        An existing cache file.
    key_json : str
        The key the record must carry (its file name is derived from it).
    device : torch.device or str
        Where its tensors are loaded.
    tensors : str
        The record's field holding a dict of tensors.
    note : callable
        ``note(record)``: the record's other values as :func:`digest` hashed them; raises
        :class:`CacheDamaged` when they are missing or of the wrong type.

    Returns
    -------
    dict
        The record.

    Raises
    ------
    CacheDamaged
        Unreadable, not a record of this kind, another key, no checksum, or a checksum mismatch.
    """
    try:
        blob = torch.load(path, map_location=device, weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file is rebuilt, whatever the cause
        raise CacheDamaged(f"unreadable ({type(e).__name__})") from None
    if not isinstance(blob, dict) or not isinstance(blob.get(tensors), dict) \
            or not all(isinstance(v, torch.Tensor) for v in blob[tensors].values()):
        raise CacheDamaged("not a cache record of this kind")
    if blob.get("key_json") != key_json:
        raise CacheDamaged("its key is not the one of its file name")
    stored = blob.get("checksum")
    if not isinstance(stored, str):
        raise CacheDamaged("no checksum")
    if digest(key_json, note(blob), blob[tensors]) != stored:
        raise CacheDamaged("checksum mismatch (the file was modified or damaged)")
    return blob


def save_record(path: Path, record: dict, what: str) -> bool:
    """Write ``record`` to ``path`` atomically: a temporary file in the same folder, synced, renamed over ``path``.

    Parameters
    ----------
    path : Path
        The cache file; its folder is created if missing. A symlink there is replaced, not followed.
    record : dict
        Tensors, strings and numbers only (read back with ``weights_only``).
    what : str
        The kind of cache, for the warning.

    Returns
    -------
    bool
        Whether it was written. A failure is a :class:`CacheWarning`, never an error, and leaves no
        temporary file: ``OSError`` from the file system, or ``RuntimeError``, which ``torch.save``
        raises when the disk fills up.
    """
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            torch.save(record, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
        return True
    except (OSError, RuntimeError) as e:
        # A cache costs time, not correctness: the run goes on without it.
        warnings.warn(f"could not write {what} {path}: {e}", CacheWarning, stacklevel=3)
        return False
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def check_loss(model: GrowthModel, ds: Dataset, *, warmup_steps: int, batch_size: int) -> float:
    """The model's loss on the train batch right after the warm-up (``index = warmup_steps``).

    Computed in eval mode and without gradients, so that it is a deterministic function of
    the weights (up to reduction order); the model's mode is restored.

    Returns
    -------
    float
        The loss (may be non-finite for a diverged model).
    """
    inputs, targets = ds.batch(batch_size, "train", warmup_steps)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return float(model.loss(inputs, targets))
    finally:
        model.train(was_training)


def _check_weights(state: dict[str, torch.Tensor], init: dict[str, torch.Tensor], *, reach: float) -> None:
    """``CacheDamaged`` unless the cached ``state`` matches ``init``'s entries and is finite and within ``reach``."""
    if set(state) != set(init):
        raise CacheDamaged(f"its tensors ({len(state)}) are not the model's ({len(init)})")
    for name in sorted(state):
        t, t0 = state[name], init[name]
        if not isinstance(t, torch.Tensor) or t.shape != t0.shape or t.dtype != t0.dtype:
            raise CacheDamaged(f"tensor {name} has the wrong type, shape or dtype")
        if not t.is_floating_point():
            continue
        bad = int((~torch.isfinite(t)).sum())
        if bad:
            raise CacheDamaged(f"tensor {name} has {bad} non-finite entries")
        t0 = t0.to(t.device)
        dist = (t.double() - t0.double()).abs()
        allowed = reach + REACH_ATOL + REACH_RTOL * t0.double().abs()
        if (dist > allowed).any():
            i = int((dist - allowed).argmax())
            raise CacheDamaged(f"tensor {name} is implausible: entry {i} is {t.reshape(-1)[i].item():.4g}, "
                           f"{dist.reshape(-1)[i].item():.4g} from its initial value, beyond the "
                           f"{reach:.4g} that the warm-up's Adam steps can reach")


def _load(path: Path, key_json: str, model: GrowthModel, device: torch.device | str, ds: Dataset, *,
          warmup_steps: int, batch_size: int, lr: float) -> bool:
    """Load a verified cache file into ``model`` (freshly built, untrained).

    Returns
    -------
    bool
        True when loaded; False (never raises) when there is no file, or, with a
        :class:`CacheWarning` naming the file and the reason, when it fails a check of
        the module docstring. ``model`` may then hold some of the file's tensors.
    """
    if not path.is_file():
        return False
    try:
        blob = read_record(path, key_json, device, "state_dict", _loss_note)
        state, loss = blob["state_dict"], blob["loss"]
        if not math.isfinite(loss):
            raise CacheDamaged(f"stored check loss {loss} is not finite")
        # model is still the fresh initialisation: the reference of Adam's reach.
        _check_weights(state, model.state_dict(), reach=ADAM_REACH * lr * warmup_steps)
        try:
            model.load_state_dict(state, strict=True)
            again = check_loss(model, ds, warmup_steps=warmup_steps, batch_size=batch_size)
        except Exception as e:  # noqa: BLE001 - whatever the cause, the file cannot stand for a warm-up
            raise CacheDamaged(f"unusable ({type(e).__name__})") from None
        rtol = max(LOSS_RTOL, 16 * torch.finfo(model.dtype).eps)
        if not abs(again - loss) <= rtol * max(1.0, abs(loss)):
            raise CacheDamaged(f"implausible weights: check loss {again:.6g}, stored {loss:.6g}")
        return True
    except CacheDamaged as e:
        warnings.warn(f"warm-up cache {path}: {e}; retraining and overwriting it", CacheWarning, stacklevel=3)
        return False


def _loss_note(blob: dict) -> str:
    """A warm-up record's check loss as :func:`checksum` hashes it."""
    if not isinstance(blob.get("loss"), float):
        raise CacheDamaged("no checksum or check loss")
    return blob["loss"].hex()


def _save(path: Path, key_json: str, model: GrowthModel, loss: float) -> None:
    """Write the weights, their check ``loss`` and checksum (:func:`save_record`). Non-finite weights or loss
    are not written (a warning says so)."""
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    if not math.isfinite(loss) or not all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point()):
        # A cache of a diverged warm-up would fail its own check on every load.
        warnings.warn(f"warm-up diverged (check loss {loss}); not cached in {path}", CacheWarning, stacklevel=3)
        return
    record = {"key_json": key_json, "state_dict": state, "loss": float(loss),
              "checksum": checksum(key_json, loss, state)}
    save_record(path, record, "warm-up cache")


def trained_model(ds: Dataset, d_k: int, *, warmup_steps: int = 200, batch_size: int = 64, lr: float = 3e-3,
                  n_heads: int = 1, bias: bool = False, scale_policy: str = "rescale",
                  cache_dir: str | Path | None = "results/cache", dtype: torch.dtype = torch.float32,
                  device: torch.device | str = "cpu") -> GrowthModel:
    """A model of ``ds`` after the warm-up, from the cache when a verified entry exists.

    A cache file that fails a check (module docstring) is replaced, with a
    :class:`CacheWarning`, by a fresh warm-up: the result is the same either way.

    Parameters
    ----------
    ds : Dataset
        Source of the model (``build_model``) and of the training batches.
    d_k : int
        Query/key width of every head.
    warmup_steps, batch_size, lr : int, int, float
        Adam steps, batch size and learning rate; step ``i`` uses ``ds.batch(batch_size, "train", i)``.
    n_heads, bias, scale_policy, dtype, device
        Passed to ``ds.build_model``.
    cache_dir : str or Path or None
        Directory of the cache; ``None`` disables it.

    Returns
    -------
    GrowthModel
        Trained, on ``device``, parameters requiring grad.
    """
    if warmup_steps < 0 or batch_size < 1:
        raise ValueError(f"warmup_steps must be >= 0 and batch_size >= 1, got {warmup_steps}, {batch_size}")
    build: dict[str, Any] = dict(n_heads=n_heads, bias=bias, scale_policy=scale_policy, dtype=dtype, device=device)
    model = ds.build_model(d_k, **build)
    if cache_dir is None or warmup_steps == 0:
        # Without a warm-up the model is what build_model made: nothing to keep, and the check on loading
        # would cost a 64-sample batch of the real models (a whole forward of the decoder, and its targets).
        warm_up(model, ds, steps=warmup_steps, batch_size=batch_size, lr=lr)
        return model
    key_json = cache_key(ds, d_k, warmup_steps=warmup_steps, batch_size=batch_size, lr=lr, **build)
    path = cache_path(cache_dir, ds, key_json)
    if _load(path, key_json, model, device, ds, warmup_steps=warmup_steps, batch_size=batch_size, lr=lr):
        return model
    # A failed load_state_dict may have copied some tensors already: start from a clean model.
    model = ds.build_model(d_k, **build)
    warm_up(model, ds, steps=warmup_steps, batch_size=batch_size, lr=lr)
    _save(path, key_json, model, check_loss(model, ds, warmup_steps=warmup_steps, batch_size=batch_size))
    return model
