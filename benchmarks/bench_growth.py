"""The whole growth step ``s.grow(...)`` for every preset, on the reference problem."""

from . import common


class TimeGrow:
    """``strategies.make(preset).grow(W_Q, W_K, X, G, p=8, ...)``: statistics, direction, line search, truncation."""

    params = (common.PRESETS,)
    param_names = ["preset"]
    setup_cache = staticmethod(common.reference_cache)
    timeout = 300
    number = 1
    repeat = (2, 5, 20.0)
    warmup_time = 0.0

    def setup(self, cache, preset):
        self.prob = common.ReferenceProblem(cache)
        self.s = common.make(preset)
        self.prob.grow(self.s)  # warm-up: first-use costs out of the samples

    def time_grow(self, cache, preset):
        self.prob.grow(self.s)
