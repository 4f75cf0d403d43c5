"""``Statistics.update``: the two Gram sums over one batch, and formula 1's per-sample sandwich."""

import pytest
import torch
from micro_common import D_E, D_S, B, anisotropic_inputs

from growbench import strategies


@pytest.mark.parametrize("b", [64, B])
def test_update_gram_sums(benchmark, b):
    X = anisotropic_inputs(b, D_S, D_E)
    G = torch.randn(b, D_S, D_S, generator=torch.Generator().manual_seed(1)) / (b * D_S)
    benchmark.group = "statistics.update"
    stats = benchmark(lambda: strategies.Statistics().update(X, G))
    assert stats.n == b


@pytest.mark.parametrize("inverse", list(strategies.REGISTRY["inverse"]))
def test_update_per_sample(benchmark, batch, inverse):
    X, G = batch
    s = strategies.make(f"per-sample/{inverse}/full/fast:grid")
    benchmark.group = "statistics.update per-sample"
    stats = benchmark(lambda: s.new_statistics().update(X, G))
    assert stats.n == X.shape[0]
