"""The reference projection's on-disk cache: ``ΠG`` of a run's captured data, keyed, checksummed and checked.

Every strategy of a configuration is scored against the same ``ΠG``
(:func:`strategies.metrics.projection`), whose solve can take half a minute, so
:func:`harness.measure.reference_projection` keeps it in ``<cache_dir>/reference-<hash>.pt``.
A file stands for a solve only when all of these hold; otherwise a
:class:`~datasets.cache.CacheWarning` names the file and the reason, and the projection is
solved again and the file overwritten:

1. it unpickles (weights only: no code runs) to a record carrying this key
   (:func:`reference_key`: the sha256 of ``G``, ``X`` and the mask with their dtypes and
   shapes, :data:`strategies.metrics.REFERENCE_VERSION`, torch's version, the device type);
2. its checksum (:func:`datasets.cache.digest` over the key, the solve's report and
   ``ΠG``'s bytes) matches: a flipped bit anywhere is seen;
3. ``ΠG`` has ``G``'s shape, is float64 and finite;
4. ``ΠG`` is an orthogonal projection of ``G``: ``⟨G, ΠG⟩ = ‖ΠG‖²`` within
   :data:`ORTHOGONALITY_RTOL` of ``‖G‖ ‖ΠG‖``. Every solve satisfies it (the dense solve and
   each CG iterate are Galerkin projections: 1e-9 after 300 iterations stalled at residual
   1e-6), and a ``ΠG`` scaled by ``c`` misses it by ``|1 - c|`` times the bottleneck: a
   file holding ``10 ΠG``, which would make every optimality 10 times too small, is refused.

The record's mechanics are the warm-up cache's (:func:`datasets.cache.read_record`,
:func:`datasets.cache.save_record`): written to a temporary file with the user's own
permissions and renamed over the target; a write that fails, a full disk included, costs
time, not correctness. The checksum proves that a file is whole, not who wrote it: the
cache directory is trusted, like pip's cache, and should be the user's own.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import warnings
from pathlib import Path

import torch

from growbench.datasets.cache import CacheDamaged, CacheWarning, digest, read_record, save_record
from growbench.strategies import metrics
from growbench.strategies.cg import CGInfo

#: Largest ``|⟨G, ΠG⟩ − ‖ΠG‖²|`` accepted, as a share of ``‖G‖ ‖ΠG‖`` (module docstring, check 4).
ORTHOGONALITY_RTOL = 1e-4
_INFO_FIELDS = tuple(f.name for f in dataclasses.fields(CGInfo))


def reference_key(G: torch.Tensor, X: torch.Tensor, mask: torch.Tensor | None) -> str:
    """Canonical JSON of everything ``ΠG`` depends on: the data's bytes (as a sha256), the definition, the kernels."""
    h = hashlib.sha256()
    for t in (G, X, mask):
        if t is not None:
            h.update(str((t.dtype, tuple(t.shape))).encode())
            h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return json.dumps({
        "data": h.hexdigest(),
        # The lead's constant may not exist yet in every checkout: 1 stands for the definition before it.
        "reference_version": getattr(metrics, "REFERENCE_VERSION", 1),
        "torch": torch.__version__,
        "device_type": X.device.type,
    }, sort_keys=True, separators=(",", ":"))


def reference_path(cache_dir: str | Path, key_json: str) -> Path:
    """``<cache_dir>/reference-<sha256(key_json)[:32]>.pt``."""
    return Path(cache_dir) / f"reference-{hashlib.sha256(key_json.encode()).hexdigest()[:32]}.pt"


def _info_note(blob: dict) -> str:
    """The solve's report of a record as the checksum hashes it (canonical JSON)."""
    info = blob.get("info")
    if not isinstance(info, dict) or set(info) != set(_INFO_FIELDS):
        raise CacheDamaged("no solve report")
    return json.dumps(info, sort_keys=True)


def load_reference(path: Path, key_json: str, G: torch.Tensor,
                   mask: torch.Tensor | None) -> tuple[torch.Tensor, CGInfo] | None:
    """``(ΠG, info)`` from a cache file that passes every check of the module docstring, else None.

    Never raises: no file is None; a file failing a check is None with a :class:`CacheWarning`.
    """
    if not path.is_file():
        return None
    try:
        blob = read_record(path, key_json, G.device, "tensors", _info_note)
        PiG = blob["tensors"].get("PiG")
        if set(blob["tensors"]) != {"PiG"} or PiG.shape != G.shape or PiG.dtype != torch.float64:
            raise CacheDamaged("its projection has the wrong shape or dtype")
        if not bool(torch.isfinite(PiG).all()):
            raise CacheDamaged("its projection is not finite")
        _check_orthogonal(PiG, G, mask)
        return PiG, CGInfo(**blob["info"])
    except CacheDamaged as e:
        warnings.warn(f"reference cache {path}: {e}; solving again and overwriting it", CacheWarning, stacklevel=2)
        return None


def _check_orthogonal(PiG: torch.Tensor, G: torch.Tensor, mask: torch.Tensor | None) -> None:
    """:class:`CacheDamaged` unless ``⟨G, ΠG⟩ = ‖ΠG‖²`` (check 4 of the module docstring)."""
    Gd = G.double() if mask is None else G.double().masked_fill(~mask, 0.0)
    inner, energy = float((Gd * PiG).sum()), float((PiG * PiG).sum())
    scale = math.sqrt(energy) * float(torch.linalg.vector_norm(Gd))
    if abs(inner - energy) > ORTHOGONALITY_RTOL * scale:
        ratio = inner / energy if energy else math.inf
        raise CacheDamaged(f"implausible projection: ⟨G, ΠG⟩ / ‖ΠG‖² = {ratio:.6g}, not 1 (a projection of G "
                           f"would give 1)")


def save_reference(path: Path, key_json: str, ref: tuple[torch.Tensor, CGInfo]) -> None:
    """Write ``(ΠG, info)`` with its key and checksum (:func:`datasets.cache.save_record`); a failure only warns."""
    tensors = {"PiG": ref[0].detach().cpu()}
    info = dataclasses.asdict(ref[1])
    record = {"key_json": key_json, "tensors": tensors, "info": info,
              "checksum": digest(key_json, _info_note({"info": info}), tensors)}
    save_record(path, record, "reference cache")
