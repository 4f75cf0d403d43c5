"""Statistics accumulation: ``Statistics.update`` over one batch, per averaging formula (docs/mathematics.md §3)."""

from . import common


class TimeStatisticsUpdate:
    """One ``update(X, G)`` of fresh statistics; per-sample's cost depends on its inverse."""

    params = (common.STAT_KINDS, [64, 256], [64, 128])
    param_names = ["statistics", "b", "d_e"]
    timeout = 120

    def setup(self, kind, b, d_e):
        common.init_torch()
        self.s = common.make(common.spec_of(kind))
        pr = common.untrained_problem(b=b, d_e=d_e)
        self.X, self.G = pr.X, pr.G
        self.s.new_statistics().update(self.X, self.G)  # first-call overheads out of the samples

    def time_update(self, kind, b, d_e):
        self.s.new_statistics().update(self.X, self.G)
