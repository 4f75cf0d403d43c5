"""Building a strategy from its spec: one registered component per axis, composed."""

from __future__ import annotations

from .growth import GrowthStrategy, Strategy
from .registry import REGISTRY
from .spec import Spec


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
    averaging, inverse, truncation, line_search, baseline : dict, optional
        Keyword options of each component's constructor, e.g.
        ``inverse={"rtol": 1e-6}``, ``truncation={"oversample": 16, "n_iter": 4}``,
        ``averaging={"tol": 1e-8}`` (joint), ``line_search={"newton_steps": 2}``.

    Returns
    -------
    Strategy
        With ``spec``, ``direction``, ``grow`` and ``new_statistics``.
    """
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
    ls = REGISTRY["line_search"][parsed.line_search](method=parsed.method, **(line_search or {}))
    return GrowthStrategy(avg, trunc, ls, str(parsed))
