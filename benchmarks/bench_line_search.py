"""Choosing λ (docs/mathematics.md §5): each path (normal / fast) × search method (grid / bounded / newton).

All on the reference problem (``datasets.teacher.reference_problem``, built once by
``common.reference_cache``) with formula 4's direction and a full-SVD truncation at ``d_k + p``.
"""

from . import common


class TimeLineSearch:
    """``REGISTRY["line_search"][path](method=...).search(problem, log, info)`` alone."""

    params = (common.LINE_SEARCHES, common.METHODS)
    param_names = ["line_search", "method"]
    setup_cache = staticmethod(common.reference_cache)
    timeout = 300
    number = 1
    repeat = (2, 5, 20.0)
    warmup_time = 0.0

    def setup(self, cache, path, method):
        strategies = common.require("strategies", "REGISTRY")
        self.prob = common.search_problem(common.ReferenceProblem(cache), common.make("gram/solve/full/fast:grid"))
        try:
            self.ls = strategies.REGISTRY["line_search"][path](method=method)
        except (KeyError, ValueError):
            common.skip(f"line search {path}:{method} unknown at this commit")
        self.ls.search(self.prob, [], {})  # warm-up: autograd's first use, scipy import

    def time_search(self, cache, path, method):
        self.ls.search(self.prob, [], {})


class TrackLineSearch:
    """Cost and outcome of each line search inside a whole growth (``gram/solve/full/{path}:{method}``).

    Lower is better for every value, as for times: ``asv compare`` flags a rise as a regression.
    """

    params = (common.LINE_SEARCHES, common.METHODS)
    param_names = ["line_search", "method"]
    setup_cache = staticmethod(common.reference_cache)
    timeout = 300
    rounds = 1  # deterministic

    def setup(self, cache, path, method):
        prob = common.ReferenceProblem(cache)
        self.r = prob.grow(common.make(f"gram/solve/full/{path}:{method}"))

    def track_loss_evals(self, cache, path, method):
        """``r.n_loss_evals``: evaluations of ``loss_of_scores`` in one ``grow`` (the current loss included)."""
        return self.r.n_loss_evals

    track_loss_evals.unit = "evaluations"

    def track_loss_remaining(self, cache, path, method):
        """``loss_after / loss_before`` on the batch: the share of the loss the growth leaves."""
        return self.r.loss_after / self.r.loss_before

    track_loss_remaining.unit = "ratio"
