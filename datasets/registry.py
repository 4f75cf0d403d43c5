"""The registry of the benchmark's datasets: each makes deterministic batches and the model ``embed -> block -> head``.

``make_dataset(name, d_e, d_s, seed, **options)`` builds one by registry name and
``trained_model(ds, d_k, ...)`` returns its model after a cached warm-up.

``growbench.datasets`` has no ``__init__.py`` on purpose: a folder named ``datasets`` with one
would be a regular package wherever the checkout is the current directory, and it would
shadow Hugging Face's ``datasets`` there (Python puts the current directory first on the
path). Without one it is a namespace portion, which an installed package always outranks.
The same holds for ``models`` and ``harness``.
"""

from __future__ import annotations

from typing import Any

from .base import Dataset, GrowthModel, sinusoidal_encoding
from .cache import CACHE_VERSION, trained_model
from .digits import DigitsDataset
from .icl_regression import ICLRegressionDataset
from .minilm import MiniLMRecoveryDataset, MiniLMSimilarityDataset
from .smollm import SmolLMLanguageDataset, SmolLMRecoveryDataset
from .teacher import TeacherDataset
from .text import TextDataset

DATASETS: dict[str, type[Dataset]] = {
    cls.name: cls for cls in (TeacherDataset, ICLRegressionDataset, DigitsDataset, TextDataset,
                              MiniLMRecoveryDataset, MiniLMSimilarityDataset, SmolLMRecoveryDataset,
                              SmolLMLanguageDataset)
}
#: Datasets of a real pretrained model: a fixed width (the model's), so not in the synthetic size grids.
PRETRAINED_DATASETS = tuple(name for name, cls in DATASETS.items() if cls.kind == "pretrained")


def parse_dataset(spec: str) -> tuple[str, dict[str, str]]:
    """Split ``"name:key=value:key=value"`` into the registry name and its options (values as strings).

    Raises
    ------
    ValueError
        An option without ``=``.
    """
    name, *pairs = spec.split(":")
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"dataset {spec!r}: option {pair!r} is not key=value")
        options[key] = value
    return name, options


def make_dataset(name: str, d_e: int, d_s: int, seed: int = 0, **options: Any) -> Dataset:
    """Build the dataset registered as ``name``.

    ``name`` may carry options, ``"minilm-recovery:layer=3:head=7"``; keyword
    ``options`` override them.

    Raises
    ------
    ValueError
        Unknown ``name`` (the message lists the valid names), or unsupported
        ``d_e``/``d_s``/options.
    """
    name, inline = parse_dataset(name)
    options = {**inline, **options}
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
    "MiniLMRecoveryDataset",
    "MiniLMSimilarityDataset",
    "PRETRAINED_DATASETS",
    "SmolLMLanguageDataset",
    "SmolLMRecoveryDataset",
    "TeacherDataset",
    "TextDataset",
    "make_dataset",
    "parse_dataset",
    "sinusoidal_encoding",
    "trained_model",
]
