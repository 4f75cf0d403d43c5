"""Datasets of the benchmark: each makes deterministic batches and the model ``embed -> block -> head``.

``make_dataset(name, d_e, d_s, seed, **options)`` builds one by registry name and
``trained_model(ds, d_k, ...)`` returns its model after a cached warm-up.
"""

from __future__ import annotations

from typing import Any

from .base import Dataset, GrowthModel, sinusoidal_encoding
from .cache import CACHE_VERSION, trained_model
from .digits import DigitsDataset
from .icl_regression import ICLRegressionDataset
from .teacher import TeacherDataset
from .text import TextDataset

DATASETS: dict[str, type[Dataset]] = {
    cls.name: cls for cls in (TeacherDataset, ICLRegressionDataset, DigitsDataset, TextDataset)
}


def make_dataset(name: str, d_e: int, d_s: int, seed: int = 0, **options: Any) -> Dataset:
    """Build the dataset registered as ``name``.

    Raises
    ------
    ValueError
        Unknown ``name`` (the message lists the valid names), or unsupported
        ``d_e``/``d_s``/options.
    """
    try:
        cls = DATASETS[name]
    except KeyError:
        raise ValueError(f"unknown dataset {name!r}; valid names: {', '.join(DATASETS)}") from None
    return cls(d_e, d_s, seed, **options)


__all__ = [
    "CACHE_VERSION",
    "DATASETS",
    "Dataset",
    "DigitsDataset",
    "GrowthModel",
    "ICLRegressionDataset",
    "TeacherDataset",
    "TextDataset",
    "make_dataset",
    "sinusoidal_encoding",
    "trained_model",
]
