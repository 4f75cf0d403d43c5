"""Warm-up training and its on-disk cache.

Growth is measured at a trained point: :func:`trained_model` trains every parameter of
a fresh model with Adam for ``warmup_steps`` train batches (``index = step``) and caches
the resulting ``state_dict``. A cache file is keyed by the sha256 of a JSON of every
setting that affects the weights, written atomically, and checked on load; anything
wrong with it (unreadable, stale, incompatible) means retrain and overwrite, never fail.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch

from .base import Dataset, GrowthModel

# Bump when a change of the code (datasets, models, warm-up) changes trained weights.
CACHE_VERSION = 1


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


def _load(path: Path, key_json: str, model: GrowthModel, device: torch.device | str) -> bool:
    """Load a valid cache file into ``model``; False (never raises) if absent, corrupt, stale or incompatible."""
    if not path.is_file():
        return False
    try:
        blob = torch.load(path, map_location=device, weights_only=True)
        if not isinstance(blob, dict) or blob.get("key_json") != key_json:
            return False
        model.load_state_dict(blob["state_dict"], strict=True)
        return True
    except Exception:  # noqa: BLE001 - a broken cache file of any kind just means retraining
        return False


def _save(path: Path, key_json: str, model: GrowthModel) -> None:
    """Write atomically: a temp file in the same directory, then ``os.replace``."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            torch.save({"key_json": key_json, "state_dict": state}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        # An unwritable cache costs time, not correctness.
        warnings.warn(f"could not write warm-up cache {path}: {e}", stacklevel=3)
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def trained_model(ds: Dataset, d_k: int, *, warmup_steps: int = 200, batch_size: int = 64, lr: float = 3e-3,
                  n_heads: int = 1, bias: bool = False, scale_policy: str = "rescale",
                  cache_dir: str | Path | None = "results/cache", dtype: torch.dtype = torch.float32,
                  device: torch.device | str = "cpu") -> GrowthModel:
    """A model of ``ds`` after the warm-up, from the cache when a valid entry exists.

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
    if cache_dir is None:
        warm_up(model, ds, steps=warmup_steps, batch_size=batch_size, lr=lr)
        return model
    key_json = cache_key(ds, d_k, warmup_steps=warmup_steps, batch_size=batch_size, lr=lr, **build)
    path = cache_path(cache_dir, ds, key_json)
    if _load(path, key_json, model, device):
        return model
    # A failed load_state_dict may have copied some tensors already: start from a clean model.
    model = ds.build_model(d_k, **build)
    warm_up(model, ds, steps=warmup_steps, batch_size=batch_size, lr=lr)
    _save(path, key_json, model)
    return model
