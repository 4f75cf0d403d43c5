"""Constants and seeded inputs shared by the micro-benchmarks (imported by ``conftest.py`` and the tests)."""

from __future__ import annotations

import math
import os

import torch

# As the asv suites (benchmarks/common.py): 1 intra-op thread unless GROWBENCH_BENCH_THREADS says otherwise.
THREADS = int(os.environ.get("GROWBENCH_BENCH_THREADS", "1"))
B, D_S, D_E, D_K, P = 256, 128, 64, 8, 8  # the reference problem of harness.reference
COND = 100.0


def anisotropic_inputs(b: int, d_s: int, d_e: int, cond: float = COND, seed: int = 0):
    """``X (b, d_s, d_e) ~ N(0, Σ)`` with ``cond(Σ) = cond``, float32, seeded."""
    gen = torch.Generator().manual_seed(seed)
    Q, _ = torch.linalg.qr(torch.randn(d_e, d_e, generator=gen, dtype=torch.float64))
    w = torch.logspace(0, -math.log10(cond), d_e, dtype=torch.float64)
    L = torch.linalg.cholesky((Q * w) @ Q.T)
    return (torch.randn(b, d_s, d_e, generator=gen, dtype=torch.float64) @ L.T).float()
