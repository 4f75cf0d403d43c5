"""Interchangeable strategies for growing the query/key dimension ``d_k`` of attention.

Public API::

    from growbench import strategies
    strategies.presets()                       # {name: spec}
    strategies.specs()                         # every spec of the full grid
    s = strategies.make("gram/solve/rsvd+metric/fast:newton")   # or a preset name, or a Spec
    d = strategies.make("default")             # each grow() runs the choice of X's regime (device, d_e)
    strategies.default_spec(device="cuda", d_e=1024)            # which spec that is
    P = s.direction(X, G, mask=None)           # (b, d_s, d_e), (b, d_s, d_s) -> (d_e, d_e)
    r = s.grow(W_Q, W_K, X, G, p=4, loss_of_scores=fn, scale=c, new_scale=c2, mask=None)
    stats = s.new_statistics(); stats.update(X, G)
    strategies.metrics.optimality(G, X, r.dZ)
    strategies.Spec.parse("formula2").replace(method="newton")   # a spec as a value

A new component is one class registered with :func:`register` (see ``registry.py``).
The mathematics is in ``docs/mathematics.md``.
"""

# The component files register themselves on import: every axis's file is imported here.
from . import averaging, baselines, inverse, line_search, metrics, truncation  # noqa: F401
from .averaging import Averaging
from .factory import DefaultStrategy, make
from .growth import GrowthStrategy, StepContext, Strategy, build_search_problem, current_scores
from .line_search import METHODS, LineSearch, SearchProblem, factor_scores, truncated_scores
from .regimes import Regime
from .registry import REGISTRY, register
from .result import GrowthResult
from .scores_loss import AttentionSplit, FactoredAttention
from .spec import Spec, baseline_names, canonical, default_choice, default_spec, parse, presets, specs
from .statistics import Statistics
from .truncation import Metric, Truncation

__all__ = [
    "METHODS",
    "REGISTRY",
    "AttentionSplit",
    "FactoredAttention",
    "Averaging",
    "DefaultStrategy",
    "GrowthResult",
    "GrowthStrategy",
    "LineSearch",
    "Metric",
    "Regime",
    "SearchProblem",
    "Spec",
    "Statistics",
    "StepContext",
    "Strategy",
    "Truncation",
    "baseline_names",
    "build_search_problem",
    "canonical",
    "current_scores",
    "default_choice",
    "default_spec",
    "factor_scores",
    "make",
    "metrics",
    "parse",
    "presets",
    "register",
    "specs",
    "truncated_scores",
]
