"""Truncated SVD ``T_r`` of a step ``Z − λP̂`` (docs/mathematics.md §4): full vs randomised, plain vs metric-aware."""

from . import common


class TimeTruncation:
    """``REGISTRY["truncation"][name](metric=...)(Y, rank, metric)`` on a ``(d_e, d_e)`` step.

    ``Y`` is a rank-``rank`` product plus a full-rank step (what ``Z − λP̂`` looks like);
    the metric is ``E[A]^{1/2}`` of anisotropic inputs (cond 100), built in setup.
    """

    params = (common.TRUNCATIONS, [False, True], [64, 256, 1024], [8, 32])
    param_names = ["truncation", "metric", "d_e", "rank"]
    timeout = 120

    def setup(self, name, metric, d_e, rank):
        torch = common.init_torch()
        strategies = common.require("strategies", "REGISTRY")
        trunc_mod = common.require("strategies.truncation", "Metric")
        try:
            self.trunc = strategies.REGISTRY["truncation"][name](metric=metric)
        except KeyError:
            common.skip(f"truncation {name!r} unknown at this commit")
        gen = torch.Generator().manual_seed(common.SEED)
        U, V = torch.randn(d_e, rank, generator=gen), torch.randn(d_e, rank, generator=gen)
        self.Y = U @ V.mT / d_e + 0.1 * torch.randn(d_e, d_e, generator=gen) / d_e**0.5
        self.rank = rank
        self.metric = None
        if metric:
            self.metric = trunc_mod.Metric(common.anisotropic_covariance(d_e, common.COND, gen).float())
        self.trunc(self.Y, self.rank, self.metric)

    def time_truncate(self, name, metric, d_e, rank):
        self.trunc(self.Y, self.rank, self.metric)
