"""Regimes: where a growth runs (device kind × band of widths), the unit of the ``default`` choice.

The best strategy depends on where it runs: at ``d_e`` 32 on a CPU every candidate reaches
its path's best and the cheapest wins, while at ``d_e`` 768 on a GPU an eigendecomposition
dominates the time and a local line-search model misses most of the decrease. The default
is therefore chosen per regime (``strategies/default.json`` holds one choice each), and a
strategy asked for the default resolves its regime from the inputs it is given.

A regime with no evidence borrows the choice of its nearest neighbour (:func:`nearest`):
the same band on the other device first, since a band changes what quality a search
reaches, while a device mostly changes time; then the nearest band on the same device.

This module imports nothing of the package.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

#: Device kinds: ``cpu``, and ``cuda`` for any accelerator (torch's CUDA and ROCm builds both say cuda).
DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class Band:
    """Widths ``low < d_e ≤ high`` (``high`` None: unbounded)."""

    name: str
    low: int
    high: int | None

    def holds(self, d_e: int) -> bool:
        return self.low < d_e and (self.high is None or d_e <= self.high)

    def describe(self) -> str:
        if self.low == 0:
            return f"d_e ≤ {self.high}"
        if self.high is None:
            return f"d_e > {self.low}"
        return f"{self.low} < d_e ≤ {self.high}"


#: The width bands, narrowest first: a toy block, one of a BERT-base-sized model, one of an LLM's.
BANDS = (Band("small", 0, 128), Band("medium", 128, 1024), Band("large", 1024, None))
_BAND_INDEX = {b.name: i for i, b in enumerate(BANDS)}


def device_kind(device: object) -> str:
    """``cpu`` or ``cuda`` of a device, a device string (``"cuda:1"``) or a tensor's ``.device``."""
    kind = str(getattr(device, "type", device)).split(":")[0].strip().lower()
    return "cpu" if kind == "cpu" else "cuda"


@dataclass(frozen=True)
class Regime:
    """One device kind and one band of widths.

    Attributes
    ----------
    device : str
        One of :data:`DEVICES`.
    band : str
        The name of one of :data:`BANDS`.
    """

    device: str
    band: str

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(f"unknown regime device {self.device!r}; valid: {', '.join(DEVICES)}")
        if self.band not in _BAND_INDEX:
            raise ValueError(f"unknown regime band {self.band!r}; valid: {', '.join(_BAND_INDEX)}")

    @classmethod
    def of(cls, device: object, d_e: int) -> Regime:
        """The regime of a growth on ``device`` at width ``d_e`` (≥ 1)."""
        if isinstance(d_e, bool) or not isinstance(d_e, int) or d_e < 1:
            raise ValueError(f"d_e must be an integer >= 1, got {d_e!r}")
        band = next(b for b in BANDS if b.holds(d_e))
        return cls(device_kind(device), band.name)

    @classmethod
    def parse(cls, key: object) -> Regime:
        """The regime of a key such as ``"cuda/medium"``; ``ValueError`` naming the valid keys otherwise."""
        device, _, band = str(key).partition("/")
        try:
            return cls(device, band)
        except ValueError:
            raise ValueError(f"unknown regime {key!r}; valid: {', '.join(r.key for r in all_regimes())}") from None

    @property
    def key(self) -> str:
        """``device/band``, the regime's key in ``default.json``."""
        return f"{self.device}/{self.band}"

    def describe(self) -> str:
        """E.g. ``"cuda, 128 < d_e ≤ 1024"``."""
        return f"{self.device}, {BANDS[_BAND_INDEX[self.band]].describe()}"

    @property
    def width(self) -> int:
        """One width inside the band (its upper end; the lower end + 1 for the unbounded band)."""
        band = BANDS[_BAND_INDEX[self.band]]
        return band.high or band.low + 1

    def distance(self, other: Regime) -> float:
        """Two per band step, one for the other device: a band changes quality, a device mostly time."""
        return 2 * abs(_BAND_INDEX[self.band] - _BAND_INDEX[other.band]) + (self.device != other.device)

    def __str__(self) -> str:
        return self.key


def all_regimes() -> list[Regime]:
    """Every regime, cpu first, narrowest band first."""
    return [Regime(d, b.name) for d in DEVICES for b in BANDS]


def nearest(regime: Regime, available: Iterable[Regime]) -> Regime:
    """The regime of ``available`` nearest to ``regime`` (itself when present).

    Ties go to the narrower band, then to cpu: the regime with the cheaper, better measured evidence.

    Raises
    ------
    ValueError
        ``available`` is empty.
    """
    best, best_key = None, (math.inf,)
    for r in available:
        key = (regime.distance(r), _BAND_INDEX[r.band], DEVICES.index(r.device))
        if key < best_key:
            best, best_key = r, key
    if best is None:
        raise ValueError("no regime has a choice")
    return best
