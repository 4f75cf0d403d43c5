"""Truncated SVD of a ``(d_e, d_e)`` step: ``strategies`` full vs rsvd, plain and metric-aware."""

import pytest
import torch
from micro_common import COND, anisotropic_inputs

from growbench import strategies
from growbench.strategies.truncation import Metric


@pytest.fixture(scope="module", params=[64, 256, 1024], ids=lambda d: f"d{d}")
def step(request):
    d = request.param
    gen = torch.Generator().manual_seed(0)
    U, V = torch.randn(d, 16, generator=gen), torch.randn(d, 16, generator=gen)
    Y = U @ V.mT / d + 0.1 * torch.randn(d, d, generator=gen) / d**0.5
    X = anisotropic_inputs(4, 2 * d, d, COND)
    Xf = X.reshape(-1, d)
    return Y, Metric(Xf.mT @ Xf / X.shape[0])


@pytest.mark.parametrize("metric", [False, True], ids=["plain", "metric"])
@pytest.mark.parametrize("name", list(strategies.REGISTRY["truncation"]))
def test_truncate(benchmark, step, name, metric):
    Y, W = step
    trunc = strategies.REGISTRY["truncation"][name](metric=metric)
    benchmark.group = f"truncation d_e={Y.shape[0]} rank=16"
    U, s, V = benchmark(trunc, Y, 16, W if metric else None)
    assert s.shape == (16,)
