"""Interchangeable strategies for growing the query/key dimension ``d_k`` of attention.

Public API::

    import strategies
    strategies.presets()                       # {name: spec}
    strategies.specs()                         # every spec of the full grid
    s = strategies.make("gram/solve/rsvd+metric/fast:newton")   # or a preset name
    P = s.direction(X, G, mask=None)           # (b, d_s, d_e), (b, d_s, d_s) -> (d_e, d_e)
    r = s.grow(W_Q, W_K, X, G, p=4, loss_of_scores=fn, scale=c, new_scale=c2, mask=None)
    stats = s.new_statistics(); stats.update(X, G)
    strategies.metrics.optimality(G, X, r.dZ)

See ``../shared/MATH.md`` for the mathematics.
"""

from . import metrics
from .averaging import Averaging
from .growth import GrowthStrategy, StepContext, Strategy, build_search_problem
from .line_search import LineSearch, SearchProblem, truncated_scores
from .registry import REGISTRY, canonical, default_spec, make, parse, presets, register, specs
from .result import GrowthResult
from .statistics import Statistics
from .truncation import Metric, Truncation

__all__ = [
    "REGISTRY",
    "Averaging",
    "GrowthResult",
    "GrowthStrategy",
    "LineSearch",
    "Metric",
    "SearchProblem",
    "Statistics",
    "StepContext",
    "Strategy",
    "Truncation",
    "build_search_problem",
    "canonical",
    "default_spec",
    "make",
    "metrics",
    "parse",
    "presets",
    "register",
    "specs",
    "truncated_scores",
]
