"""Constants and seeded inputs shared by the micro-benchmarks (imported by ``conftest.py`` and the tests)."""

from __future__ import annotations

import os

import torch

from growbench.datasets import teacher

# As the asv suites (benchmarks/common.py): 1 intra-op thread unless GROWBENCH_BENCH_THREADS says otherwise.
THREADS = int(os.environ.get("GROWBENCH_BENCH_THREADS", "1"))
B, D_S, D_E, D_K, P = 256, 128, 64, 8, 8  # the reference problem of datasets.teacher
COND = 100.0


def anisotropic_inputs(b: int, d_s: int, d_e: int, cond: float = COND, seed: int = 0) -> torch.Tensor:
    """``X (b, d_s, d_e) ~ N(0, Σ)`` with ``cond(Σ) = cond``, float32, seeded."""
    gen = torch.Generator().manual_seed(seed)
    chol = torch.linalg.cholesky(teacher.anisotropic_covariance(d_e, cond, gen))
    return teacher.anisotropic_inputs(b, d_s, chol, gen).float()
