"""Building a strategy from its spec: one registered component per axis, composed.

``make("default")`` builds a :class:`DefaultStrategy`, which resolves its regime (device
kind × band of widths) from the inputs of each call and runs that regime's choice.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from .growth import GrowthStrategy, StepContext, Strategy
from .registry import REGISTRY
from .result import GrowthResult
from .spec import DEFAULT_FILE, DefaultChoice, Spec, default_choice
from .statistics import Statistics


def make(
    spec: str | Spec,
    *,
    averaging: dict | None = None,
    inverse: dict | None = None,
    truncation: dict | None = None,
    line_search: dict | None = None,
    baseline: dict | None = None,
) -> Strategy:
    """Build a strategy from a spec string, a :class:`Spec` or a preset name.

    Parameters
    ----------
    spec : str or Spec
        E.g. ``"gram/solve/rsvd+metric/fast:newton"``, ``"formula1"``, ``"default"``, ``"gradmax"``.
        ``"default"`` gives a :class:`DefaultStrategy` (the regime's choice, resolved per call).
    averaging, inverse, truncation, line_search, baseline : dict, optional
        Keyword options of each component's constructor, e.g.
        ``inverse={"rtol": 1e-6}``, ``truncation={"oversample": 16, "n_iter": 4}``,
        ``averaging={"tol": 1e-8}`` (joint), ``line_search={"newton_steps": 2}``,
        ``line_search={"damping": 0.3}`` (with ``+damp``).

    Returns
    -------
    Strategy
        With ``spec``, ``direction``, ``grow`` and ``new_statistics``.
    """
    options = dict(averaging=averaging, inverse=inverse, truncation=truncation, line_search=line_search,
                   baseline=baseline)
    if isinstance(spec, str) and spec.strip().lower() == "default":
        if baseline:
            raise ValueError("baseline=... options only apply to the baselines")
        return DefaultStrategy(**{k: v for k, v in options.items() if k != "baseline"})
    parsed = spec if isinstance(spec, Spec) else Spec.parse(spec)
    if parsed.is_baseline:
        if any(o for o in (averaging, inverse, truncation, line_search)):
            raise ValueError(f"baseline {parsed.baseline!r} only takes baseline=... options")
        return REGISTRY["baseline"][parsed.baseline](**(baseline or {}))
    if baseline:
        raise ValueError("baseline=... options only apply to the baselines")
    inv = REGISTRY["inverse"][parsed.inverse](**(inverse or {}))
    avg = REGISTRY["averaging"][parsed.averaging](inv, **(averaging or {}))
    trunc = REGISTRY["truncation"][parsed.truncation](metric=parsed.metric, **(truncation or {}))
    flags = {flag: getattr(parsed, flag) for flag in Spec.LINE_SEARCH_FLAGS}
    ls = REGISTRY["line_search"][parsed.line_search](method=parsed.method, **flags, **(line_search or {}))
    return GrowthStrategy(avg, trunc, ls, str(parsed))


class DefaultStrategy(Strategy):
    """The ``default`` preset: each call runs the choice of the regime of its inputs.

    The regime (:class:`strategies.regimes.Regime`) comes from ``X``'s device and width
    ``d_e``; its spec from ``strategies/default.json`` (:func:`strategies.spec.default_choice`,
    nearest regime with evidence when it has none). The result's ``spec`` is the spec that
    ran; ``info["default_regime"]`` names the regime, and a borrowed choice is recorded in
    ``fallback``, as is a regime where the evidence says growth does not generalise (the
    spec that ran is then the one that harms least).

    Parameters
    ----------
    averaging, inverse, truncation, line_search : dict, optional
        Component options, as for :func:`make`, passed to whichever spec runs.
    """

    spec = "default"

    def __init__(self, **options: dict | None) -> None:
        self.options = options
        self._built: dict[str, GrowthStrategy] = {}

    def choice(self, device: object, d_e: int) -> DefaultChoice:
        """Which spec runs for inputs on ``device`` of width ``d_e``, and why."""
        return default_choice(device, d_e)

    def resolve(self, device: object, d_e: int) -> GrowthStrategy:
        """The strategy that runs for inputs on ``device`` of width ``d_e`` (built once per spec)."""
        return self._built_for(self.choice(device, d_e))

    def _built_for(self, chosen: DefaultChoice) -> GrowthStrategy:
        if chosen.spec not in self._built:
            self._built[chosen.spec] = make(chosen.spec, **self.options)
        return self._built[chosen.spec]

    def _for(self, tensor: Tensor) -> GrowthStrategy:
        return self.resolve(tensor.device, int(tensor.shape[-1]))

    def new_statistics(self) -> Statistics:
        """Empty statistics of the reference regime's choice.

        Every built-in averaging but ``per-sample`` and ``joint`` keeps the same sums; if the
        regime of the data needs another kind, :meth:`grow` says which to build.
        """
        return make(default_choice().spec, **self.options).new_statistics()

    def direction(self, X: Tensor | Statistics, G: Tensor | None = None, mask: Tensor | None = None) -> Tensor:
        """The direction of the regime's choice (regime from ``X``, or from the statistics' sums)."""
        like = X.sum_A if isinstance(X, Statistics) and X.sum_A is not None else X
        if not isinstance(like, Tensor):
            raise ValueError("direction(stats): the statistics are empty (call update first)")
        return self._for(like).direction(X, G, mask)

    def grow(self, W_Q: Tensor, W_K: Tensor, X: Tensor, G: Tensor, p: int,
             loss_of_scores: Callable[[Tensor], Tensor], scale: float | None = None, new_scale: float | None = None,
             mask: Tensor | None = None, stats: Statistics | None = None) -> GrowthResult:
        """:meth:`Strategy.grow` with the choice of ``X``'s regime; see the class docstring for what it records."""
        if not isinstance(X, Tensor) or X.dim() < 1:
            raise ValueError("X must be a tensor (b, d_s, d_e)")
        chosen = self.choice(X.device, int(X.shape[-1]))  # default.json is read once per growth
        strategy = self._built_for(chosen)
        if stats is not None and type(stats) is not type(strategy.new_statistics()):
            raise ValueError(
                f"stats of type {type(stats).__name__} do not fit the default for {chosen.regime.describe()}, "
                f"{chosen.spec}: build them with strategies.make(strategies.default_spec(device=..., d_e=...))"
                ".new_statistics()")
        result = strategy.grow(W_Q, W_K, X, G, p, loss_of_scores, scale=scale, new_scale=new_scale, mask=mask,
                               stats=stats)
        result.info["default_regime"] = chosen.regime.key
        if chosen.note:
            result.fallback.append(f"default: {chosen.note}")
        if not chosen.generalises:
            result.fallback.append(
                f"default: growth does not generalise in {(chosen.source or chosen.regime).describe()} by the "
                f"evidence of {DEFAULT_FILE}; ran {chosen.spec}, the strategy that harms least ({chosen.statement})")
        return result

    # grow and direction delegate whole; these keep the abstract interface honest for callers of the parts.
    def _direction(self, stats: Statistics, log: list[str], info: dict) -> Tensor:
        return self._for(stats.sum_A)._direction(stats, log, info)

    def _step(self, ctx: StepContext, W_Q: Tensor, W_K: Tensor, stats: Statistics, p: int):
        return self._for(ctx.X)._step(ctx, W_Q, W_K, stats, p)
