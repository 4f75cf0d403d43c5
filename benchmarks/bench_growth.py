"""The whole growth step ``s.grow(...)`` for every preset, on the reference problem; the default's multiple of the
floor, host reads and loss calls."""

import inspect
import statistics as stats_mod
import time

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


class TrackDefault:
    """The default on the reference problem (trained teacher, b=256, d_s=128, d_e=64, d_k=8, p=8: the problem of
    ``growbench targets`` at d_e=64), tracked across commits (issue 37), lower is better:

    - ``track_x_floor``: the growth's median time over the floor's, both measured here, interleaved, so that the
      machine's speed cancels. The floor is what every growth must pay, as ``growbench targets`` defines it: the
      two Gram sums over the batch (``Statistics(split_half=False)``) plus one loss call at the current scores;
    - ``track_host_syncs``: numbers the growth reads on the host (``info["host_syncs"]``; on a GPU each one
      stalls the device);
    - ``track_loss_calls``: calls of ``loss_of_scores``.
    """

    setup_cache = staticmethod(common.reference_cache)
    timeout = 300
    rounds = 1
    repeats = 7

    def setup(self, cache):
        self.torch = common.init_torch()
        self.prob = common.ReferenceProblem(cache)
        self.strategies = common.require("strategies", "make", "Statistics")
        self.s = common.make("default")
        self.r = self.prob.grow(self.s)  # warm-up, and the result the counts read
        # The two Gram sums alone. Before split_half existed, Statistics() also formed the even samples' Σ M (7–20 %
        # of the update at d_e 64 to 1024): commits before it are tracked against that larger floor.
        Statistics = self.strategies.Statistics
        self._plain = ({"split_half": False} if "split_half" in inspect.signature(Statistics).parameters else {})

    def _floor(self):
        pr = self.prob
        self.strategies.Statistics(**self._plain).update(pr.X, pr.G, pr.mask)
        with self.torch.no_grad():
            pr.loss_of_scores(pr.X @ (pr.scale * pr.W_Q @ pr.W_K.mT) @ pr.X.mT)

    def track_x_floor(self, cache):
        grow, floor = [], []
        for _ in range(self.repeats):
            grow.append(_seconds(lambda: self.prob.grow(self.s)))
            floor.append(_seconds(self._floor))
        return stats_mod.median(grow) / stats_mod.median(floor)

    track_x_floor.unit = "× floor"

    def track_host_syncs(self, cache):
        return float(self.r.info.get("host_syncs", float("nan")))

    track_host_syncs.unit = "reads"

    def track_loss_calls(self, cache):
        return float(self.r.n_loss_evals)

    track_loss_calls.unit = "calls"


def _seconds(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t
