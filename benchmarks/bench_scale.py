"""The growth step at transformer scale: the scale set's widths as a parameter (CPU up to d_e = 1024).

Each width has its own (b, d_s, d_k, p), as in ``growbench targets``:
64 → (256, 128, 8, 8), 256 → (64, 256, 16, 16), 768 → (32, 512, 32, 32),
1024 → (16, 1024, 32, 32). d_e = 4096 (8, 2048, 64, 64) needs a GPU and is measured by
``growbench targets --device cuda``, not here.

``time_grow`` is the whole step; ``track_x_floor`` the step's median over the floor
(the two Gram sums plus one loss call) measured in the same process, and
``track_path_shortfall`` is ``1 −`` the step's batch decrease over the best one of a
40-point scan of the same truncated path: both lower is better.
"""

import statistics as stats_mod
import time

from . import common

SCALE_SET = {64: (256, 128, 8, 8), 256: (64, 256, 16, 16), 768: (32, 512, 32, 32), 1024: (16, 1024, 32, 32)}
SPECS = ["default", "gram/solve/rsvd+metric/fast:bracket", "gram/solve/full+metric/fast:quadratic"]


class ScaleSet:
    params = (SPECS, list(SCALE_SET))
    param_names = ["spec", "d_e"]
    timeout = 600
    number = 1
    repeat = (1, 3, 30.0)
    warmup_time = 0.0

    def setup(self, spec, d_e):
        b, d_s, d_k, p = SCALE_SET[d_e]
        self.prob = common.untrained_problem(b=b, d_s=d_s, d_e=d_e, d_k=d_k)
        self.p = p
        self.s = common.make(spec)
        self.r = self._grow()  # warm-up, and the result the track_* values read

    def _grow(self):
        pr = self.prob
        return self.s.grow(pr.W_Q, pr.W_K, pr.X, pr.G, p=self.p, loss_of_scores=pr.loss_of_scores, scale=pr.scale)

    def time_grow(self, spec, d_e):
        self._grow()

    def track_x_floor(self, spec, d_e):
        torch = common.init_torch()
        pr = self.prob
        S = pr.X @ (pr.scale * pr.W_Q @ pr.W_K.mT) @ pr.X.mT

        def floor():
            Xf = pr.X.reshape(-1, d_e)
            Xf.mT @ Xf, Xf.mT @ (pr.G @ pr.X).reshape(-1, d_e)
            with torch.no_grad():
                pr.loss_of_scores(S)

        return stats_mod.median(_times(self._grow, 3)) / stats_mod.median(_times(floor, 3))

    track_x_floor.unit = "× floor"

    def track_path_shortfall(self, spec, d_e):
        torch = common.init_torch()
        strategies = common.require("strategies", "truncated_scores")
        pr, s = self.prob, self.s
        if not hasattr(s, "truncation"):
            common.skip("baselines take no step")
        prob = common.search_problem(pr, s, pr.W_Q.shape[1] + self.p)
        with torch.no_grad():
            lams = [prob.lam_unit * 10 ** (-3 + 5 * i / 39) for i in range(40)]
            best = min(float(prob.loss(strategies.truncated_scores(pr.X, *prob.truncate(prob.Z - lam * prob.P_hat))))
                       for lam in lams)
        decrease = self.r.loss_before - self.r.loss_after
        return 1.0 - decrease / (prob.loss0 - best) if prob.loss0 > best else 0.0

    track_path_shortfall.unit = "1 - share"


def _times(fn, n):
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out
