"""Quality of one growth per preset on the reference problem (docs/mathematics.md §7), as asv ``track_*`` values.

Every value is oriented so that lower is better, like a time: a commit that makes a
strategy worse shows up in ``asv compare`` / ``asv continuous`` as a regression, exactly
like one that makes it slower.

- ``optimality_gap`` = ``1 − optimality``, ``optimality = −⟨G, dS⟩ / (‖dS‖ ‖ΠG‖)``
  (``strategies.metrics.optimality``): 0 for the exact joint direction without rank limit;
- ``first_order_remaining`` = ``1 − first_order_decrease / loss_before``: the share of the
  loss left after the step, to first order;
- ``loss_remaining`` = ``loss_after / loss_before``: the same, actually measured on the batch.
"""

from . import common


class TrackQuality:
    params = (common.PRESETS,)
    param_names = ["preset"]
    setup_cache = staticmethod(common.reference_cache)
    timeout = 300
    rounds = 1  # deterministic: one process is enough

    def setup(self, cache, preset):
        self.prob = common.ReferenceProblem(cache)
        self.metrics = common.require("strategies.metrics", "optimality", "first_order_decrease")
        self.r = self.prob.grow(common.make(preset))

    def track_optimality_gap(self, cache, preset):
        p = self.prob
        return 1.0 - self.metrics.optimality(p.G, p.X, self.r.dZ, p.mask)

    track_optimality_gap.unit = "1 - cos"

    def track_first_order_remaining(self, cache, preset):
        return 1.0 - self.r.first_order_decrease / self.r.loss_before

    track_first_order_remaining.unit = "ratio"

    def track_loss_remaining(self, cache, preset):
        return self.r.loss_after / self.r.loss_before

    track_loss_remaining.unit = "ratio"
