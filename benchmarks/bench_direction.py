"""The direction ``P`` from accumulated statistics, for each averaging × inverse (docs/mathematics.md §3)."""

from . import common


class TimeDirection:
    """``strategies.make(f"{avg}/{inv}/full/fast:grid").direction(stats)``; statistics built in setup."""

    params = (common.AVERAGINGS, common.INVERSES, [64, 128])
    param_names = ["averaging", "inverse", "d_e"]
    timeout = 120

    def setup(self, avg, inv, d_e):
        common.init_torch()
        self.s = common.make(f"{avg}/{inv}/full/fast:grid")
        pr = common.untrained_problem(d_e=d_e)
        self.stats = self.s.new_statistics().update(pr.X, pr.G)
        self.s.direction(self.stats)

    def time_direction(self, avg, inv, d_e):
        self.s.direction(self.stats)
